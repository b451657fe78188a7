"""`gateway experiments report | promote`.

    gateway experiments report LOG... [--experiment NAME] [--control ARM] [--tenant NAME] [--slo-ms MS]
                                      [--bootstrap N] [--permutations N] [--seed S] [--csv PATH] [--png PATH]
    gateway experiments promote NAME ARM --policy FILE [--tenant NAME] [--write]

Exit status: 0 done, 1 an output could not be written (report) or the promotion is impossible, 2 bad
arguments or unreadable files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from gateway.experiments.report import PERMUTATIONS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway experiments", description="Routing experiments: report and promote.")
    commands = p.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="per arm: latency, goodput, cost, feedback, shadow agreement "
                                                 "with bootstrap 95%% intervals and verdicts against control "
                                                 "(permutation tests, Holm-corrected)")
    report.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="request log files (plain or .gz)")
    report.add_argument("--experiment", action="append", metavar="NAME", help="only this experiment (repeatable)")
    report.add_argument("--control", metavar="ARM", help="the control arm (default: the one the log lines mark)")
    report.add_argument("--tenant", metavar="NAME", help="only this tenant's lines")
    report.add_argument("--slo-ms", type=float, metavar="MS",
                        help="TTFT objective for goodput (default: each line's ttft_slo_ms; none: served = good)")
    report.add_argument("--bootstrap", type=int, default=1000, metavar="N", help="resamples (default 1000)")
    report.add_argument("--permutations", type=int, default=PERMUTATIONS, metavar="N",
                        help=f"relabellings per comparison for the p-values (default {PERMUTATIONS})")
    report.add_argument("--seed", type=int, default=0)
    report.add_argument("--csv", type=Path, metavar="PATH", help="also write the rows as CSV")
    report.add_argument("--png", type=Path, metavar="PATH", help="also draw the figures as a PNG (matplotlib)")
    promote = commands.add_parser("promote", help="print the policy change (a unified diff) that makes ARM the "
                                                   "default and ends experiment NAME")
    promote.add_argument("name", metavar="NAME")
    promote.add_argument("arm", metavar="ARM")
    promote.add_argument("--policy", type=Path, required=True, metavar="FILE")
    promote.add_argument("--tenant", metavar="NAME", help="the tenant whose experiment it is, when several have one")
    promote.add_argument("--write", action="store_true", help="also write the change to FILE")
    return p


def run_experiments(argv: Sequence[str]) -> int:
    try:
        args = parser().parse_args(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.command == "promote":
        return _promote(args, sys.stdout)
    return _report(args, sys.stdout)


def _report(args: argparse.Namespace, out: TextIO) -> int:
    from gateway.experiments.render import missing_matplotlib, table, write_csv
    from gateway.experiments.report import analyze, collect
    from gateway.accounting.report_files import write_output

    unreadable = [str(p) for p in args.logs if not p.is_file()]
    problem = f"not a readable file: {', '.join(unreadable)}" if unreadable else None
    if problem is None and (args.bootstrap < 1 or args.permutations < 1):
        problem = "--bootstrap and --permutations must be at least 1"
    if problem is None and args.png:
        problem = missing_matplotlib()
    if problem:
        print(f"gateway experiments report: {problem}", file=sys.stderr)
        return 2
    collected = collect(args.logs, args.slo_ms, args.tenant)
    rows = analyze(collected, control=args.control, experiments=args.experiment, n_boot=args.bootstrap,
                   seed=args.seed, n_perm=args.permutations)
    if not rows:
        print("No request lines with an experiment and an arm in these logs.", file=out)
    else:
        print(table(rows, collected), file=out)
    print(f"Lines read: {collected.stats.lines:,} in {collected.stats.files} file(s); request lines in an "
          f"experiment: {collected.stats.records:,}; malformed: {collected.malformed:,}; console text skipped: "
          f"{collected.text:,}; feedback/shadow lines "
          f"not matched to an arm: {collected.unmatched_feedback:,}", file=out)
    for error in collected.stats.file_errors:
        print(f"Unreadable: {error}", file=out)
    status = 0
    if args.csv:
        status |= write_output("gateway experiments report", args.csv, lambda: write_csv(rows, args.csv), out)
    if args.png:
        from gateway.experiments.render import draw

        status |= write_output("gateway experiments report", args.png, lambda: draw(rows, args.png), out)
    return status



def _promote(args: argparse.Namespace, out: TextIO) -> int:
    from gateway.experiments.promote import PromoteError, promote, unified_diff

    try:
        old = args.policy.read_text(encoding="utf-8")
    except OSError as exc:
        print(f"gateway experiments promote: cannot read {args.policy}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        result = promote(old, args.name, args.arm, args.tenant)
    except PromoteError as err:
        print(f"gateway experiments promote: {err}", file=sys.stderr)
        return 1
    what = f"sets {', '.join(result.fields)} in {result.scope}" if result.fields else "changes no field (rollback)"
    print(f"# promote {args.name}/{args.arm}: {what} and removes the experiment", file=sys.stderr)
    for note in result.notes:
        print(f"# note: {note}", file=sys.stderr)
    out.write(unified_diff(old, result.text, str(args.policy)))
    if args.write:
        args.policy.write_text(result.text, encoding="utf-8")
        print(f"# wrote {args.policy}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_experiments(sys.argv[1:]))
