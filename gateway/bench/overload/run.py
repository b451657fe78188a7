"""The two parts of the overload benchmark: the capacity search and load sweep, and the multi-turn replay."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import redis

from gateway.bench.arrivals import poisson_offsets
from gateway.bench.overload.fleet import PROFILE, TPOT_SLO_MS, TTFT_SLO_MS, FleetSpec
from gateway.bench.overload.measure import Env, cap_lengths, find_capacity, open_loop_point, replay
from gateway.bench.procs import RunStart
from gateway.bench.report import log
from gateway.bench.workload import sharegpt_conversations, sharegpt_requests
from gateway.emulator.profiles import get_profile
from gateway.local.redis_server import EmbeddedRedis

LOADS = (0.5, 1.0, 2.0, 3.0)  # offered load, in multiples of C
SWEEP_REPLICAS = 2
MAX_TOKENS = 256
MAX_PROMPT_TOKENS = 1024


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


async def run(args: argparse.Namespace, start: RunStart, tmp: Path, store: EmbeddedRedis) -> dict[str, Any]:
    d = durations(args.quick)
    tuned = admission_settings(args.admission, args.gateway_defaults)
    client = redis.Redis.from_url(store.url)
    assert store.process is not None
    env = Env(tmp, start.gw_cpu, store.url, store.process.pid, client.flushall, log)
    result: dict[str, Any] = {"durations": d, "admission_settings": tuned, "slo_ms": {"ttft": TTFT_SLO_MS,
                                                                                     "tpot": TPOT_SLO_MS}}
    if "sweep" not in args.skip:
        result["sweep"] = await sweep(env, args, d, tuned)
    if "multiturn" not in args.skip:
        result["multiturn"] = await multiturn(env, args, d)
    return result
