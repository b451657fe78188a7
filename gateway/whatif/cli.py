"""`gateway whatif`: price and time a routes or policy change on recorded traffic.

    gateway whatif --log requests.log.1 requests.log --routes routes/new.yaml --policies policies/new.yaml \\
        [--baseline-routes routes/local.yaml --baseline-policies policies/local.yaml] \\
        [--json out.json] [--html report.html] [--window 2026-11-21T14:00 2026-11-21T15:00]
    gateway whatif --log requests.log --routes routes/local.yaml --policies policies/local.yaml --calibrate

Exit status 0, or 2 when a file does not load (each issue printed with its file and field).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.whatif.calibrate import errors
from gateway.whatif.replay import MAX_WINDOW, RECORDED, replay
from gateway.whatif.report import document, html, table
from gateway.whatif.simulate import ensemble, fit_fleet, fitted_physics, record_window, simulate_ensemble

NOT_MODELLED = (
    "prefix affinity and the predicted-TTFT ranking (the replica with the fewest requests stands for them); "
    "brownout, priority classes and TTFT-SLO deadlines in the admission queue; replica failures; "
    "escalation on low confidence (the logged answer's tier and tokens are kept); "
    "spill decided on the forecasts the log recorded (the load the logged policy put on each tier, not the "
    "candidate's: the latency window does not re-decide spill against the simulated fleet); "
    "a conversation continued from a reply the gateway did not give (the replay links turns by the conversation "
    "through the reply, not by the reply's text) and sessions on lines written before turn_keys (replay 1); "
    "semantic cache hits on a tier other than the logged one; prefix-cache hits beyond the logged ones (a request "
    "moved to another tier is prefilled whole); output lengths on another tier (the logged ones); "
    "a CPU-served (llama.cpp) machine's external load under the candidate (its other tenants' work: the speed "
    "each tier's replicas ran at beyond the gateway's own load is replayed as the log measured it; only the "
    "contention of the machine's replicas busy at once and each replica's own batch follow the candidate's load), "
    "the gateway process's own "
    "CPU per request (part of the external speed, as the log's traffic spent it)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway whatif", description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--log", nargs="+", type=Path, required=True, help="request log files, oldest first (gzip too)")
    p.add_argument("--routes", type=Path, required=True, help="the candidate routes file")
    p.add_argument("--policies", type=Path, required=True, help="the candidate policy file")
    p.add_argument("--baseline-routes", type=Path, default=None,
                   help="the routes that produced the log (default: the candidate's)")
    p.add_argument("--baseline-policies", type=Path, default=None,
                   help="the policy that produced the log (default: the candidate's)")
    p.add_argument("--calibrate", action="store_true",
                   help="replay against the policy that produced the log (--routes/--policies) and report each "
                        "figure's error against what the log recorded")
    p.add_argument("--json", type=Path, default=None, help="write {recorded, baseline, candidate} here ('-': stdout)")
    p.add_argument("--html", type=Path, default=None, help="write the self-contained HTML report here")
    p.add_argument("--window", nargs=2, metavar=("FROM", "TO"), default=None,
                   help="the latency window, ISO times in UTC (default: the busiest hour)")
    p.add_argument("--max-window", type=int, default=MAX_WINDOW,
                   help="requests simulated at most; beyond, the window's busiest stretch (default: %(default)s)")
    return p


def run_whatif(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    candidate = _load(args.routes, args.policies)
    baseline = candidate if args.baseline_routes is None and args.baseline_policies is None else _load(
        args.baseline_routes or args.routes, args.baseline_policies or args.policies)
    if candidate is None or baseline is None:
        return 2
    started = time.perf_counter()
    scenarios = {"baseline": baseline} if args.calibrate else {"baseline": baseline, "candidate": candidate}
    window = None if args.window is None else (_time(args.window[0]), _time(args.window[1]))
    result = replay(args.log, scenarios, window=window, max_window=args.max_window)
    decided_s = time.perf_counter() - started
    record_window(result.window, result.tallies[RECORDED])
    physics: dict[str, Any] = {}
    fleet = fit_fleet(baseline, result.window, result.samples)
    for name, config in scenarios.items():
        physics[name] = {tier: f.describe() for tier, f in fitted_physics(config, result.samples, fleet).items()}
        simulate_ensemble(name, config, result.window, ensemble(config, result.samples, fleet), result.tallies[name])
    meta = _meta(result, decided_s, time.perf_counter() - started, physics) | {"replays": len(fleet.members())}
    doc = document(result.tallies, meta, None)
    doc["calibration"] = errors(doc[RECORDED], doc["baseline"], result.tallies[RECORDED].ttft_rank)
    if args.json is not None:
        data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
        if str(args.json) == "-":
            sys.stdout.buffer.write(data + b"\n")
        else:
            args.json.write_bytes(data)
    if args.html is not None:
        args.html.write_text(html(doc, result.tallies, candidate), encoding="utf-8")
    if str(args.json) != "-":
        print(table(doc))
    return 0


def _meta(result: Any, decided_s: float, total_s: float, physics: dict[str, Any]) -> dict[str, Any]:
    stats, window = result.stats, result.window
    return {
        "requests": stats.requests, "price_only": stats.price_only, "lines": stats.read.lines,
        "other_paths": stats.other_paths, "skipped_lines": stats.skipped, "file_errors": stats.read.file_errors,
        "window": {"from": _iso(window.start), "to": _iso(window.end), "requests": window.hour_requests,
                   "simulated": len(window.rows), "sampled": window.sampled},
        "physics": physics, "not_modelled": NOT_MODELLED,
        "seconds": {"decisions": round(decided_s, 3), "total": round(total_s, 3)},
    }


def _load(routes: Path, policies: Path) -> GatewayConfig | None:
    try:
        return load_config(routes, policies)
    except ConfigError as err:
        for issue in err.issues:
            print(issue, file=sys.stderr)
        return None


def _time(text: str) -> float:
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts else ""
