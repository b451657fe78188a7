"""The quality gate (issue 22): routing experiments, shadow comparisons, feedback, and the report.

    assign.py    sticky arm assignment and the arm's effective TenantPolicy (request path, a few µs)
    feedback.py  POST /v1/feedback's core: validation, tenant check (request id -> owner map), storage
    shadow.py    background resend to a reference tier, agreement scoring, the bounded pair store
    report.py    `gateway experiments report`: per-arm figures with bootstrap intervals and verdicts
    promote.py   `gateway experiments promote`: the policy edit that makes an arm the default
    cli.py       the `gateway experiments` subcommand
    serving.py   the wiring on the request path: owner record, shadow sampling at routing, the gateway's own
                 shadow send (batch priority, never queued), admission pressure, the low-priority encoder

Nothing is imported here: the stages import only `assign` (no numpy); the app wires `serving`, `shadow` and
`feedback`; the tools import the rest.
"""
