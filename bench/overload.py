"""Overload benchmark (issue 7): admission control and prefix-aware replica choice against emulators.

    .venv/bin/python bench/overload.py [--quick] [--capacity RATE] [--admission KEY=VALUE ...]

On 127.0.0.1: `overload` emulators (2 replicas; 4 for the multi-turn replay), one gateway on generated
routes/policy files (one tier; tenant `interactive`, priority interactive, TTFT SLO 500 ms), an
embedded Redis, and the load generator in this process. The gateway is pinned to one CPU; the
emulators, Redis and this process to the other(s).

1. Capacity C: admission off and no SLO in the policy; Poisson ShareGPT first turns (prompts
   <= 1024 tokens, max_tokens = the reference answer's length capped at 256, ignore_eos) at rising
   rates; C = the highest rate with p99 TTFT <= 500 ms, p99 TPOT <= 50 ms and nothing failed.
2. 0.5C, 1C, 2C, 3C, admission on and off: p50/p99 TTFT and TPOT of answered requests, share
   shed, goodput (requests meeting both SLOs / arrival window), CPU cores used by each process.
3. Multi-turn ShareGPT conversations on 4 replicas: predicted-TTFT choice with Redis prefix
   affinity vs round-robin without Redis (round_robin alone keeps affinity): backend prefix-cache
   hit rate and TTFT.

Every point runs on a fresh fleet. Results: JSON under bench/results/, a table on stdout; a full run
also writes docs/overload*.png and the overload section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _load as L  # noqa: E402
from _overload_fleet import PROFILE, TPOT_SLO_MS, TTFT_SLO_MS, FleetSpec  # noqa: E402
from _overload_load import Env, cap_lengths, find_capacity, open_loop_point, replay  # noqa: E402
from _overload_report import render, write_docs  # noqa: E402

from gateway.bench import poisson_offsets, sharegpt_conversations, sharegpt_requests  # noqa: E402
from gateway.emulator.profiles import get_profile  # noqa: E402
from gateway.local.redis_server import EmbeddedRedis  # noqa: E402

LOADS = (0.5, 1.0, 2.0, 3.0)  # offered load, in multiples of C
SWEEP_REPLICAS = 2
MAX_TOKENS = 256
MAX_PROMPT_TOKENS = 1024


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="short durations (a smoke run); docs are not written")
    p.add_argument("--capacity", type=float, metavar="RATE", help="skip the search: C = RATE req/s")
    p.add_argument("--start-rate", type=float, default=1.0, help="first rate of the capacity search (req/s)")
    p.add_argument("--admission", action="append", default=[], metavar="KEY=VALUE",
                   help="an `admission:` setting of the routes file for the admission-on runs (e.g. "
                        "ttft_target_ms=300); default: initial_limit and max_limit = the fleet's batch slots")
    p.add_argument("--gateway-defaults", action="store_true",
                   help="admission-on runs with the gateway's default admission settings only")
    p.add_argument("--conversations", type=int, help="multi-turn replay: conversations (default 40, quick 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    p.add_argument("--skip", choices=("sweep", "multiturn"), action="append", default=[], help="leave a part out")
    return p.parse_args()


def durations(quick: bool) -> dict[str, float]:
    if quick:
        return {"probe_s": 10, "window_s": 12, "drain_s": 8, "bisect": 0, "conversations": 12, "turns": 3,
                "conv_rate": 2.0}
    return {"probe_s": 30, "window_s": 40, "drain_s": 15, "bisect": 2, "conversations": 40, "turns": 6,
            "conv_rate": 2.0}


def fleet_slots(replicas: int) -> int:
    """Sequences the sweep's fleet runs at once: replicas x the profile's max_running."""
    return replicas * get_profile(PROFILE).max_running


def admission_settings(items: list[str], gateway_defaults: bool) -> dict[str, float]:
    """The admission-on runs' settings: the limit starts at and never exceeds the fleet's batch slots
    (beyond them requests wait in the backends' queues, where admission can neither order them nor
    hold their deadlines), then the --admission items; none with --gateway-defaults."""
    slots = fleet_slots(SWEEP_REPLICAS)
    out: dict[str, float] = {} if gateway_defaults else {"initial_limit": slots, "max_limit": slots}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--admission {item!r}: expected KEY=VALUE")
        out[key.strip()] = float(value)
    return out


async def sweep(env: Env, args: argparse.Namespace, d: dict[str, float], tuned: dict[str, float]) -> dict[str, Any]:
    specs = cap_lengths(sharegpt_requests(2000, args.seed, max_prompt_tokens=MAX_PROMPT_TOKENS,
                                          max_total_tokens=MAX_PROMPT_TOKENS + 8192), MAX_TOKENS)
    probes: list[dict[str, Any]] = []
    capacity = args.capacity
    if capacity is None:
        env.log("capacity search (admission off, no SLO in the policy):")
        off = FleetSpec(replicas=SWEEP_REPLICAS, admission=False, tenant_slo=False)
        capacity, probes = await find_capacity(env, off, specs, args.start_rate, d["probe_s"], d["drain_s"],
                                               int(d["bisect"]), args.seed)
    if not capacity:
        raise RuntimeError("no probed rate met the SLOs: lower --start-rate")
    env.log(f"C = {capacity:.2f} req/s; sweep {', '.join(f'{x:g}C' for x in LOADS)}, admission on and off:")
    runs = [(load, admission, tuned if admission else {}) for load in LOADS for admission in (True, False)]
    if tuned:  # the same top point with the gateway's own defaults, for comparison
        runs.append((LOADS[-1], True, {}))
    points = []
    for load, admission, settings in runs:  # one arrival seed: every schedule is one schedule, scaled
        spec = FleetSpec(replicas=SWEEP_REPLICAS, admission=admission, admission_settings=settings)
        row = await open_loop_point(env, spec, specs, load * capacity, d["window_s"], d["drain_s"], args.seed)
        points.append({"load": load, "gateway_defaults": admission and bool(tuned) and not settings, **row})
    workload = {"first_turns": len(specs), "mean_prompt_tokens": sum(s.prompt_tokens for s in specs) / len(specs),
                "mean_max_tokens": sum(s.max_tokens for s in specs) / len(specs)}
    return {"capacity_rps": capacity, "capacity_probes": probes, "points": points, "workload": workload}


async def multiturn(env: Env, args: argparse.Namespace, d: dict[str, float]) -> dict[str, Any]:
    n = args.conversations or int(d["conversations"])
    convs = [cap_lengths(c, MAX_TOKENS) for c in sharegpt_conversations(n, int(d["turns"]), args.seed)]
    starts = poisson_offsets(len(convs), d["conv_rate"], args.seed)
    env.log(f"multi-turn replay: {len(convs)} conversations, {sum(map(len, convs))} turns, 4 replicas:")
    rows = [await replay(env, FleetSpec(replicas=4, admission=False, tenant_slo=False), convs, starts,
                         "predicted_ttft + prefix affinity"),
            await replay(env, FleetSpec(replicas=4, admission=False, tenant_slo=False, strategy="round_robin",
                                        affinity=False), convs, starts, "round_robin (no Redis)")]
    return {"conversations": len(convs), "turns": sum(map(len, convs)), "conv_rate": d["conv_rate"], "rows": rows}


async def run(args: argparse.Namespace, start: L.RunStart, tmp: Path, store: EmbeddedRedis) -> dict[str, Any]:
    d = durations(args.quick)
    tuned = admission_settings(args.admission, args.gateway_defaults)
    client = redis.Redis.from_url(store.url)
    assert store.process is not None
    env = Env(tmp, start.gw_cpu, store.url, store.process.pid, client.flushall,
              lambda line: print(line, flush=True))
    result: dict[str, Any] = {"durations": d, "admission_settings": tuned, "slo_ms": {"ttft": TTFT_SLO_MS,
                                                                                     "tpot": TPOT_SLO_MS}}
    if "sweep" not in args.skip:
        result["sweep"] = await sweep(env, args, d, tuned)
    if "multiturn" not in args.skip:
        result["multiturn"] = await multiturn(env, args, d)
    return result


def main() -> int:
    args = parse_args()
    start = L.begin(args.no_pin)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        with tempfile.TemporaryDirectory(prefix="overload-") as tmp, EmbeddedRedis() as store:
            result = uvloop.run(run(args, start, Path(tmp), store))
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped", file=sys.stderr)
        return 130
    finally:
        start.procs.close()
    result.update(command=L.command_line(), machine=start.host, pinning=start.pin_note, mode=
                  "quick" if args.quick else "full", load_start=start.load_start, load_end=L.loadavg(),
                  elapsed_s=round(time.monotonic() - start.started, 1))
    terminal, markdown = render(result)
    print("\n" + terminal)
    print(f"wrote {L.write_results('overload', stamp, result, markdown)}")
    if not args.quick and not args.skip:
        for path in write_docs(result, markdown):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
