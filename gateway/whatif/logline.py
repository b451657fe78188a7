"""What a request log line carries so that `gateway whatif` can replay it: numbers and digests, no prompt text.

`replay_fields(ctx)` is merged into the line by the account stage. With the fields the line already has
(ts, tenant, model_requested, difficulty, tier, stream, prompt_tokens, completion_tokens, cached_tokens,
max_tokens, max_tokens_clamped_from, cache, ttft_ms, tpot_ms, session, session_route, experiment, arm,
status, error), a replay re-decides the request under other routes and policies:

    replay             the version of these fields (REPLAY_VERSION); a line without it is replayed for price only
    arrival_s          the Unix time the request arrived (ts to the microsecond, as a number)
    quality_predicted  the quality predictor's score per measured model ({model: score}), when it ran
    turn_keys          the turn's place in its conversation (`gateway.conversation`), whatever the tenant's sessions
                       rule, so a policy that turns sessions on can be replayed: `current`, the digest of the
                       conversation through this request's last message, and `parent`, the digest through the
                       message before its last assistant reply (null: a first turn), which is the `current` of the
                       turn that reply answered; with an x-session-id both are its session key (`header_key`). (The
                       log holds no reply: a turn after a reply the client edited links to the turn before it,
                       where the session step, which keys by the reply too, starts anew.)
    sticky             the experiment assignment keys (`gateway.experiments.assign.sticky_key`: 64-bit) by
                       conversation (its start: `gateway.conversation.start_key`) and by `user`: a replay re-assigns
                       arms under the candidate's experiments
    reading            the request's reading summed up: input_tokens (estimate) and input_chars (the prompt caps),
                       outputs (prompts x n), generated (prompts x max(n, best_of)), cacheable ("never",
                       "deterministic": cached in either mode, "always": only in mode always) and digest (of the
                       reading: what the exact cache keys on, 16 hex, null when never cacheable)
    decode_tps         the replica's measured decode rate for this request: output tokens after the first per
                       second of decoding (null without two output tokens); its measured TTFT is `ttft_ms`
"""

from __future__ import annotations

from typing import Any

from gateway.context import RequestContext
from gateway.conversation import turn_keys
from gateway.experiments.assign import user_key
from gateway.routing.sessions import header_key

REPLAY_VERSION = 3  # 2: turn_keys; 3: turn and sticky keys of `gateway.conversation` (one hash a prefix)


def replay_fields(ctx: RequestContext) -> dict[str, Any]:
    """The replay fields of a finished request's log line (see the module docstring), in one pass: the log line
    of every request computes them."""
    reading = ctx.reading
    quality = ctx.route.quality
    body = ctx.body
    sticky = turns = summary = None
    if reading is not None:
        cacheable = reading.cache_class
        summary = {"input_tokens": reading.input_tokens, "input_chars": reading.input_chars,
                   "outputs": reading.outputs, "generated": reading.generated, "cacheable": cacheable,
                   "digest": None if cacheable == "never" else reading.key()[:16]}
        if body and ctx.endpoint != "embeddings":
            tenant = ctx.tenant_name
            parent, current, start = turn_keys(tenant, reading.parts)
            if ctx.session_header:
                parent = current = header_key(tenant, ctx.session_header)
            user = body.get("user")
            sticky = {"conversation": start, "user": user_key(tenant, user) if type(user) is str and user else None}
            turns = {"parent": parent, "current": current}
    return {"replay": REPLAY_VERSION, "arrival_s": round(ctx.ts * 1_000_000) / 1_000_000,  # (as account._ms)
            "quality_predicted": None if quality is None else {k: round(v, 4) for k, v in quality.items()},
            "sticky": sticky, "turn_keys": turns, "reading": summary, "decode_tps": _decode_tps(ctx)}


def _decode_tps(ctx: RequestContext) -> float | None:
    completion, first, done = ctx.upstream.completion_tokens or 0, ctx.upstream.first_token_at, ctx.finished_at
    outputs = ctx.reading.outputs if ctx.reading is not None else 1
    if not ctx.stream or first is None or done is None or completion <= outputs or done <= first:
        return None  # a non-streamed answer arrives whole: its first byte is not its first token
    return round((completion - outputs) / (done - first) * 1000) / 1000
