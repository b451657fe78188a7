"""`gateway costs`: totals by tenant / tier / day / session over rotated request logs, as a table, CSV and chart.

    gateway costs LOGS... [--by tenant,tier,day,session] [--from DATE] [--to DATE] [--csv OUT] [--plot OUT]

`--by session` (or tenant,session) sums each sticky-tier conversation end to end: every turn, every tier it
went through, resumed parts included; requests outside a session share the "(none)" row.

Shadow comparisons (the `shadow` lines: reference and judge calls the gateway makes on its own account) are
spend too: the `shadow $` column, on the row of the tenant whose request was compared and of the tier that
served the call (the reference tier, and the judge tier for its grading), kept out of `cost $` (what the
tenant's requests cost) and out of `requests`; the CSV adds `shadow_calls` and `spend_usd` (cost + shadow),
the chart draws spend, and the summary's first line gives the total spend with its two parts.

`requests`, `errors`, tokens and the per-request figures ($/req and latency percentiles) cover the inference
endpoints only (/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/embeddings, and lines
from before the `path` field). Lines of the other endpoints (dashboard polls, static files, admin,
count_tokens, unknown paths, parser refusals: gateway.edge.accounted, cost 0) are counted apart: the `other
endpoints` column (`other_endpoint_requests` in the CSV) and a summary line. docs/FINANCE.md says the same.

Also runnable as `python -m gateway.accounting.report LOGS...`. Exit status: 0 done, 1 the CSV or
chart could not be written, 2 bad arguments or unreadable log files.
"""

from __future__ import annotations

import argparse
import decimal
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import TextIO

from gateway.accounting.aggregate import DIMENSIONS, DailyCosts, GroupKey, Grouped, GroupStats, aggregate
from gateway.accounting.reader import ReadStats, read_records
from gateway.accounting.records import Skip
from gateway.accounting.render import money_text, table, write_csv
from gateway.accounting.report_files import write_output

# Sums run in a context wide enough never to round, and trap if they ever would.
EXACT = decimal.Context(prec=60, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow])


def _dimensions(text: str) -> tuple[str, ...]:
    parts = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in parts if p not in DIMENSIONS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"choose from {','.join(DIMENSIONS)} (got {text!r})")
    return parts


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gateway costs", description="Cost report over request logs (plain or .gz), read in the order given."
    )
    p.add_argument("logs", nargs="+", type=Path, metavar="LOGS", help="request log files, e.g. requests.log*")
    p.add_argument("--by", type=_dimensions, default=("tenant", "tier"), help="group keys (default tenant,tier)")
    p.add_argument("--from", dest="day_from", type=_day, metavar="DATE", help="first UTC day kept (inclusive)")
    p.add_argument("--to", dest="day_to", type=_day, metavar="DATE", help="last UTC day kept (inclusive)")
    p.add_argument("--csv", type=Path, metavar="OUT", help="also write the rows as CSV")
    p.add_argument("--plot", type=Path, metavar="OUT", help="also draw cost by tier per day as a PNG (matplotlib)")
    return p


def run_costs(argv: Sequence[str]) -> int:
    """Entry point of `gateway costs`; returns the exit status."""
    try:
        args = parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse: --help or a usage error, already printed
        return exc.code if isinstance(exc.code, int) else 2
    problem = _check(args)
    if problem:
        print(f"gateway costs: {problem}", file=sys.stderr)
        return 2
    with decimal.localcontext(EXACT):
        return _report(args, sys.stdout)


def _check(args: argparse.Namespace) -> str | None:
    """Fail before a long read: missing files, an empty range, no matplotlib for --plot."""
    if args.day_from and args.day_to and args.day_from > args.day_to:
        return f"--from {args.day_from} is after --to {args.day_to}"
    unreadable = [str(p) for p in args.logs if not p.is_file()]
    if unreadable:
        return f"not a readable file: {', '.join(unreadable)}"
    if args.plot:
        from gateway.accounting.plot import missing_matplotlib

        return missing_matplotlib()
    return None


def _report(args: argparse.Namespace, out: TextIO) -> int:
    stats = ReadStats()
    grouped = Grouped(args.by)
    daily = DailyCosts() if args.plot else None
    aggregate(read_records(args.logs, stats, args.day_from, args.day_to), grouped, daily)
    rows, total = grouped.rows(), grouped.total()
    span = (f"UTC days {stats.first_day} .. {stats.last_day}" if stats.records or stats.shadow_lines
            or stats.edge_lines else "no request lines")
    asked = f" (asked: {args.day_from or '...'} .. {args.day_to or '...'})" if args.day_from or args.day_to else ""
    print(f"Costs by {', '.join(args.by)}: {span}{asked}, {stats.files} file(s)\n", file=out)
    print(table(args.by, rows, total), file=out)
    status = 0
    if args.csv:
        status |= write_output("gateway costs", args.csv, lambda: _csv(args, rows, total), out, lead="\n")
    if daily is not None:
        from gateway.accounting.plot import draw

        status |= write_output("gateway costs", args.plot, lambda: draw(daily, args.plot), out, lead="\n")
    print("\n" + summary(stats, total.unpriced_baseline, total), file=out)
    return status


def _csv(args: argparse.Namespace, rows: list[tuple[GroupKey, GroupStats]], total: GroupStats) -> None:
    with open(args.csv, "w", newline="", encoding="utf-8") as f:
        write_csv(f, args.by, rows, total)



def summary(stats: ReadStats, unpriced: int, total: GroupStats | None = None) -> str:
    """What was read and what was skipped, with the first malformed lines located."""
    s = stats.skipped
    shadow = total.shadow_cost if total is not None else decimal.Decimal(0)
    spend = total.spend if total is not None else shadow
    lines = [
        f"Spend: ${money_text(spend, 4)} = requests ${money_text(spend - shadow, 4)} (cost $) + shadow comparisons "
        f"${money_text(shadow, 4)} (shadow $: "
        f"{stats.shadow_lines:,} shadow lines, the reference and judge calls, billed to no tenant)",
        f"Lines read: {stats.lines:,} in {stats.files} file(s); request lines counted: {stats.records:,}; "
        f"outside the date range: {stats.out_of_range:,}; other events: {s[Skip.OTHER_EVENT]:,}; "
        f"blank: {s[Skip.BLANK]:,}",
        f"Other endpoints' lines (dashboard, admin, static files, count_tokens, unknown paths, parser refusals: "
        f"no backend ran, cost 0), counted apart from requests: {stats.edge_lines:,}",
        f"Malformed lines skipped: {stats.malformed:,} (not JSON: {s[Skip.NOT_JSON]:,}, "
        f"missing field: {s[Skip.MISSING_FIELD]:,}, wrong type: {s[Skip.WRONG_TYPE]:,})",
        f"Unpriced baseline (no baseline_cost_usd / saved_usd, routing savings counted as 0): {unpriced:,}",
    ]
    if s[Skip.TEXT]:
        lines.insert(1, f"Text lines skipped (not JSON objects: console output such as a banner, not counted as "
                        f"malformed): {s[Skip.TEXT]:,}, the first at {stats.first_text}")
    lines += [f"  e.g. {example}" for example in stats.examples]
    lines += [f"Unreadable: {error}" for error in stats.file_errors]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(run_costs(sys.argv[1:]))
