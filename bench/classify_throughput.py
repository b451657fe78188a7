"""Cost of difficulty classification in the gateway (issue: classifier): throughput and added latency.

    .venv/bin/python bench/classify_throughput.py [--quick] [--classifier models/difficulty] [--no-pin]
        [--quality-floor F]

Starts on 127.0.0.1 one backend emulator (`instant` profile: it answers at once, so the gateway is
the bottleneck), a Redis server this script controls, and the gateway (`gateway serve`) pinned with
`taskset` to one CPU of its own: its event loop and the classifier's single ONNX thread share that
core. Requests: non-streaming chat, `model: "auto"`, max_tokens 1, no temperature (so the response
cache is bypassed), one distinct ShareGPT first-turn prompt each. Two tenants of one policy:

- OFF: tenant `plain` has no `routing`: auto goes to the default tier, nothing is classified;
- ON:  tenant `routed` has `routing: {classifier: DIR, bands: [...]}` over three `instant` tiers;
       with `--quality-floor F` also `quality_floor: F` (as policies/local.yaml serves: model auto by the
       quality predictor, models/router, the bands only when it fails), and each tier the `quality_model` of the
       tier of its name in routes/production-vllm.yaml (8B, 49B, 51B rungs; the tiers are priced alike here,
       so the floor's cheapest is the first in routes order: small, medium, large, the vLLM prices' order).
       The prompt is then encoded for the predictor and the difficulty head does not run (nor the cascade,
       which serves the bands only).

In `rounds` interleaved rounds, each on a new slice of prompts, at fixed concurrency (closed loop, no
think time): OFF, then ON cold (prompts the gateway has never seen: every one is encoded), then ON
warm (the same prompts again: the embedding comes from the in-process LRU, or the shared store).
Then the same three at concurrency 1 (the latency of one request on an idle gateway). Reports
requests/s, p50/p99 latency, the p50/p99 added by classification (ON minus OFF), gateway CPU per
request, the tiers chosen and the difficulty spread (x-gateway-tier, x-gateway-difficulty), the route
each request took (the gateway's request log: `route_reason` quality / band / default tier), and the Redis
commands each phase caused (a shared embedding store would show as MGET/SET of emb: keys). A run whose
requests did not all take their mode's route (OFF: default tier; ON: band, or quality with --quality-floor)
says so and exits 1. Every loop is bounded in count and time (170 s in all); a full run took ~8 s on an idle
2-core machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from gateway.bench.classify import FULL, QUICK, bands_of, run, shipped_cuts
from gateway.bench.configs import key_sha256
from gateway.bench.procs import begin, interrupted
from gateway.bench.report import (
    ROOT, command_line, load_sentence, log, md_table, other_cores, run_title, save_results, stamp,
)


def render(result: dict[str, Any]) -> str:
    rows = result["throughput"]["rows"]
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    table = []
    for (mode, c), r in sorted(by.items(), key=lambda kv: (-kv[0][1], ["OFF", "ON cold", "ON warm"].index(kv[0][0]))):
        off = by.get(("OFF", c))
        added = "-" if mode == "OFF" or off is None else (
            f"{r['p50_ms'] - off['p50_ms']:+.2f} / {r['p99_ms'] - off['p99_ms']:+.2f}")
        ratio = "-" if mode == "OFF" or off is None else f"{r['rps'] / off['rps']:.2f}x"
        d = r["difficulty_p10_p50_p90"]
        tiers = ", ".join(f"{k.split('-')[0]} {v}" for k, v in sorted(r["tiers"].items()))
        routes = ", ".join(f"{k} {v}" for k, v in sorted(r.get("routes", {}).items())) or "-"
        redis = ", ".join(f"{k} {v:.0f}" + (f" ({r['redis_failed'][k]:.0f} timed out)" if r["redis_failed"].get(k)
                                              else "") for k, v in r["redis_calls"].items()) or "none"
        notes = [f"{r['errors']} errors {r['error_samples']}"] if r["errors"] else []
        if r["truncated"]:
            notes.append("time limit hit")
        table.append([mode, c, r["n"], f"{r['rps']:.1f}", ratio, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", added,
                      f"{r.get('gateway_cpu_us_per_req', float('nan')) / 1e3:.2f}",
                      f"{100 * r.get('gateway_core_util', float('nan')):.0f}%", f"{r['classified']}/{r['n']}",
                      "-" if d is None else f"{d[0]:.2f} / {d[1]:.2f} / {d[2]:.2f}", tiers, routes, redis,
                      "; ".join(notes)])
    md = md_table(["classification", "c", "n", "req/s", "vs OFF", "p50 ms", "p99 ms", "added p50 / p99 ms",
                     "gateway CPU ms/req", "gateway core busy", "classified", "difficulty p10/p50/p90",
                     "tiers chosen", "route (request log)", "gateway Redis calls", "notes"], table,
                    "--- ---: ---: ---: ---: ---: ---: ---: ---: ---: ---: --- --- --- --- ---")
    per_round = []
    for (mode, c), r in sorted(by.items(), key=lambda kv: (-kv[0][1], ["OFF", "ON cold", "ON warm"].index(kv[0][0]))):
        if c != 1:
            per_round.append(f"{mode}: " + ", ".join(f"{x['rps']:.0f}" for x in r["rounds"]))
    if per_round:
        md += "\n\nreq/s per round (drift check): " + "; ".join(per_round) + "."
    md += ("\n\nGateway Redis calls: the shared embedding store (`embedding_get` = one MGET, `embedding_put` = "
           "one SET EX pipeline, in the background) is consulted on an in-process LRU miss only; a cold prompt "
           "whose `embedding_get` is missing was not looked up because the gateway held Redis down "
           "(5 ms op timeout, 3 timeouts in a row -> 1 s without Redis).")
    if result["throughput"]["skipped"]:
        md += "\n\nSkipped (time budget): " + ", ".join(result["throughput"]["skipped"])
    return md


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (~1 minute)")
    parser.add_argument("--classifier", type=Path, default=ROOT / "models" / "difficulty",
                        help="trained difficulty model folder (head.onnx + metrics.json)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    parser.add_argument("--no-redis", action="store_true", help="run the gateway without Redis")
    parser.add_argument("--concurrency", type=int, help="closed-loop concurrency (default 16)")
    parser.add_argument("--bands", metavar="CUT,CUT", type=lambda text: [float(x) for x in text.split(",")],
                        help="the two band cuts (default: policies/example.yaml's, calibrated on the shipped model)")
    parser.add_argument("--quality-floor", metavar="F", type=float,
                        help="the routed tenant routes by predicted quality with this quality_floor (policies/"
                             "local.yaml: 0.008), the bands as its fallback (default: by the bands alone)")
    args = parser.parse_args()
    if args.quality_floor is not None and not 0.0 <= args.quality_floor <= 1.0:
        parser.error("--quality-floor must be in [0, 1]")
    bands = bands_of(args.bands or shipped_cuts())
    s = QUICK if args.quick else FULL
    if args.concurrency:
        s = replace(s, concurrency=args.concurrency)
    clf = args.classifier.resolve()
    if not (clf / "head.onnx").is_file() or not (clf / "metrics.json").is_file():
        print(f"{clf}/head.onnx or metrics.json is missing: train the classifier first (gateway train)",
              file=sys.stderr)
        return 2
    when = stamp()
    start = begin(args.no_pin)
    host, pin_note = start.host, start.pin_note
    try:
        result = run(s, clf, not args.no_redis, start, log, bands, args.quality_floor)
    except KeyboardInterrupt:
        return interrupted()
    metrics_file = clf / "metrics.json"
    result.update({
        "benchmark": "classify_throughput", "machine": host, "settings": asdict(s), "pinning": pin_note,
        "classifier": str(clf), "classifier_metrics_sha": key_sha256(metrics_file.read_text()),
        "head_onnx_mtime": dt.datetime.fromtimestamp((clf / "head.onnx").stat().st_mtime).isoformat(),
        "bands": bands, "redis": not args.no_redis, "command": command_line(), "loadavg_start": start.load_start,
        "loadavg_end": os.getloadavg(), "elapsed_s": round(time.monotonic() - start.started, 1),
    })
    routing = ("the routed tenant routes by the bands" if args.quality_floor is None else
               f"the routed tenant routes by quality_floor {args.quality_floor:g} ({result['predictor_line']}; tiers' "
               f"quality_model {', '.join(f'{t} {m}' for t, m in (result['quality_models'] or {}).items())}), the "
               f"bands as its fallback")
    header = (
        f"{run_title('classify_throughput', host, args.quick, result['elapsed_s'])}\n\n{pin_note}; the classifier "
        f"runs inside the gateway process on one ONNX thread ({result['classifier_line']}); {routing}. "
        f"Non-streaming, model auto, max_tokens 1, `instant` emulator tiers, closed loop without think time; Redis "
        f"{'on (response cache bypassed: no temperature)' if not args.no_redis else 'off'}."
        f"\n\n{load_sentence(result['loadavg_start'], result['loadavg_end'], host['nproc'])}"
        f"\n\nCommand: `{result['command']}`")
    gl = result["gateway_log"]
    busy = other_cores(result.get("other_work", {}))
    md = (header + "\n\n" + render(result) + f"\n\nOther work on the machine meanwhile (cores busy outside "
          f"this benchmark's processes): {busy}. Gateway log events over the whole run: {gl['events']}.")
    if result["route_mismatches"]:
        md += ("\n\n**Not every request took its mode's route** (this run did not measure what it says): "
               + "; ".join(result["route_mismatches"]) + ".")
    print("\n" + md)
    save_results("classify_throughput", when, result, md)
    return 1 if result["route_mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
