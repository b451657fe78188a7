"""The measurements of bench/overload.py: one open-loop point, the capacity search, the multi-turn replay.

Requests go through gateway.bench (workload, arrival schedule, streaming client); this module adds
what the overload benchmark reports on top: the share shed and why, goodput over the arrival
window, CPU seconds per second of every process, and the backends' prefix-cache counters.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from gateway.bench.arrivals import Arrivals, offsets_within
from gateway.bench.client import RequestResult, request_body, request_headers, send
from gateway.bench.cpu import OtherWork
from gateway.bench.overload.fleet import API_KEY, TIER, TPOT_SLO_MS, TTFT_SLO_MS, Fleet, FleetSpec, fleet
from gateway.bench.runner import Target, open_session, run_open_loop
from gateway.bench.summary import meets, percentile
from gateway.bench.workload import RequestSpec

SLO = {"ttft": TTFT_SLO_MS, "tpot": TPOT_SLO_MS}
SHED_STATUSES = (429, 503)
_CODE = re.compile(r'"code"\s*:\s*"([a-z_]+)"')
Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Env:
    """What every measurement needs to start a fleet and to log."""

    tmp: Path
    gw_cpu: int | None
    redis_url: str
    redis_pid: int
    flush_redis: Callable[[], object]
    log: Log


def cap_lengths(specs: Sequence[RequestSpec], max_tokens: int) -> list[RequestSpec]:
    """The specs with max_tokens capped (a run stays short; the data's lengths below the cap stay)."""
    return [dataclasses.replace(s, max_tokens=min(s.max_tokens, max_tokens)) for s in specs]


def shed_reason(result: RequestResult) -> str:
    m = _CODE.search(result.error or "")
    return f"{result.status} {m.group(1) if m else '?'}"


def latency_stats(results: Sequence[RequestResult]) -> dict[str, float]:
    """p50/p99 TTFT and TPOT (ms) of the successful requests."""
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None]
    return {"p50_ttft_ms": percentile(ttft, 50), "p99_ttft_ms": percentile(ttft, 99),
            "p50_tpot_ms": percentile(tpot, 50), "p99_tpot_ms": percentile(tpot, 99)}


def cpu_rates(used: dict[str, float], wall_s: float) -> dict[str, float]:
    """CPU seconds per second (cores busy) of each process group over `wall_s`."""
    return {f"cpu_{k}": v / wall_s for k, v in used.items()}


def point_row(results: Sequence[RequestResult], window_s: float) -> dict[str, Any]:
    """Counts, shares, latencies and goodput (requests meeting both SLOs / the arrival window)."""
    n = len(results)
    shed = [r for r in results if r.status in SHED_STATUSES]
    unfinished = sum(r.error == "unfinished" for r in results)
    ok = sum(r.ok for r in results)
    return {"sent": n, "ok": ok, "shed": len(shed), "shed_share": len(shed) / n if n else math.nan,
            "shed_reasons": dict(collections.Counter(shed_reason(r) for r in shed)),
            "unfinished": unfinished, "other_failed": n - ok - len(shed) - unfinished,
            "errors": dict(collections.Counter((r.error or "")[:80] for r in results
                                               if not r.ok and r.status not in SHED_STATUSES).most_common(3)),
            "goodput_rps": sum(meets(r, SLO) for r in results) / window_s, **latency_stats(results)}


async def sample_load(f: Fleet, every_s: float, into: list[dict[str, float]]) -> None:
    """Every `every_s` until cancelled: the admission limit and the backends' queues (see load_sample)."""
    t0 = time.perf_counter()
    while True:
        with contextlib.suppress(OSError):
            into.append({"t": round(time.perf_counter() - t0, 2), **await asyncio.to_thread(f.load_sample)})
        await asyncio.sleep(every_s)


def load_summary(samples: Sequence[dict[str, float]], window_s: float) -> dict[str, float]:
    """Mean and max of the sampled backend queue and admission limit (during arrivals and drain), and
    the seconds of the arrival window in which no backend ran anything (work was arriving)."""
    def col(key: str) -> list[float]:
        return [s[key] for s in samples if not math.isnan(s[key])]
    idle = sum(1 for s in samples if 1.0 <= s["t"] < window_s and s["running"] + s["waiting"] == 0)
    out = {"idle_s": float(idle)}
    for key in ("limit", "admitted", "running", "waiting"):
        values = col(key)
        out[f"mean_{key}"] = sum(values) / len(values) if values else math.nan
        out[f"max_{key}"] = max(values, default=math.nan)
    return out


async def open_loop_point(env: Env, spec: FleetSpec, specs: Sequence[RequestSpec], rate: float,
                          window_s: float, drain_s: float, seed: int) -> dict[str, Any]:
    """Poisson arrivals at `rate` for `window_s` through a fresh fleet; in-flight requests get
    `drain_s` after the last arrival, then are cancelled (counted as unfinished)."""
    env.flush_redis()
    times = offsets_within(Arrivals("poisson", rate=rate, seed=seed), window_s)
    batch = [specs[i % len(specs)] for i in range(len(times))]  # the same requests in the same order at every rate
    label = f"{rate:.2f} req/s, admission {'on' if spec.admission else 'off'}"
    with fleet(spec, env.tmp, env.gw_cpu, env.redis_url, env.redis_pid) as f:
        target = Target(f.base_url, TIER, API_KEY)
        other = OtherWork([*f.pids(), os.getpid()])
        async with open_session(timeout_s=window_s + drain_s + 60) as session:
            samples: list[dict[str, float]] = []
            sampler = asyncio.create_task(sample_load(f, 1.0, samples))
            t0 = time.perf_counter()
            with f.cpu().measure() as used, other.phase(label, env.log):
                run = await run_open_loop(target, batch, times, duration_s=window_s, drain_s=drain_s,
                                          session=session)
            wall = time.perf_counter() - t0
            sampler.cancel()
            cpu = cpu_rates(used, wall)
        idle = await f.wait_idle()
    row = {"rate": rate, "admission": spec.admission, "window_s": window_s, "wall_s": wall,
           **point_row(run.results, window_s), **cpu, "other_cores": other.phases[label]["other_cores"],
           "fleet_idle_after": idle, **load_summary(samples, window_s), "load_samples": samples}
    env.log(f"  {label}: {row['ok']}/{row['sent']} ok, shed {row['shed_share']:.0%} {row['shed_reasons']}, "
            f"unfinished {row['unfinished']}, p99 TTFT {row['p99_ttft_ms']:.0f} ms, p99 TPOT "
            f"{row['p99_tpot_ms']:.1f} ms, goodput {row['goodput_rps']:.2f} req/s, gateway "
            f"{row['cpu_gateway']:.2f} cores; backends waiting mean {row['mean_waiting']:.1f} max "
            f"{row['max_waiting']:.0f}, admission limit mean {row['mean_limit']:.1f} max {row['max_limit']:.1f}")
    return row


def meets_capacity(row: dict[str, Any]) -> bool:
    """The capacity criterion: every request answered, p99 TTFT and p99 TPOT within the SLOs."""
    return bool(row["ok"] == row["sent"] and row["p99_ttft_ms"] <= TTFT_SLO_MS
                and row["p99_tpot_ms"] <= TPOT_SLO_MS)


async def find_capacity(env: Env, spec: FleetSpec, specs: Sequence[RequestSpec], start: float,
                        probe_s: float, drain_s: float, bisect: int, seed: int) -> tuple[float, list[dict[str, Any]]]:
    """The highest probed rate meeting both SLOs: double from `start` until one fails (halve while
    the start fails), then `bisect` geometric bisections between the last pass and the first fail.
    Every probe uses the same arrival seed: its schedule is one schedule scaled to the rate."""
    probes: list[dict[str, Any]] = []

    async def passes(rate: float) -> bool:
        row = await open_loop_point(env, spec, specs, rate, probe_s, drain_s, seed)
        row["passes"] = meets_capacity(row)
        probes.append(row)
        return bool(row["passes"])

    lo, hi, rate = 0.0, math.inf, start
    while True:  # bracket: a passing rate below a failing one
        if await passes(rate):
            lo, rate = rate, rate * 2
            if not math.isinf(hi):
                break
        else:
            hi, rate = rate, rate / 2
            if lo or rate < 0.1:
                break
    for _ in range(bisect if lo and not math.isinf(hi) else 0):
        mid = math.sqrt(lo * hi)
        if await passes(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


# --------------------------------------------------------------------------- multi-turn replay


async def conversation(session: aiohttp.ClientSession, target: Target, turns: Sequence[RequestSpec],
                       delay_s: float, t0: float) -> list[RequestResult]:
    """One conversation: its turns one after another, each sent when the previous answer has ended."""
    await asyncio.sleep(delay_s)
    headers = request_headers(target.api_key, target.extra_headers)
    out = []
    for spec in turns:
        body = request_body(spec, target.model, target.ignore_eos, target.extra_body)
        out.append(await send(session, target.url, body, headers, spec, time.perf_counter() - t0))
    return out


def hit_rate(before: dict[str, float], after: dict[str, float]) -> tuple[float, float, float]:
    """(hit rate, prefix-cache hits, queries) between two readings of the summed backend counters."""
    hits = after["vllm:prefix_cache_hits_total"] - before.get("vllm:prefix_cache_hits_total", 0.0)
    queries = after["vllm:prefix_cache_queries_total"] - before.get("vllm:prefix_cache_queries_total", 0.0)
    return (hits / queries if queries else math.nan), hits, queries


async def replay(env: Env, spec: FleetSpec, conversations: Sequence[Sequence[RequestSpec]],
                 starts: Sequence[float], label: str) -> dict[str, Any]:
    """Every conversation through a fresh fleet, conversation i starting at starts[i] seconds."""
    env.flush_redis()
    with fleet(spec, env.tmp, env.gw_cpu, env.redis_url, env.redis_pid) as f:
        target = Target(f.base_url, TIER, API_KEY)
        async with open_session(timeout_s=300) as session:
            before, t0 = f.backend_counters(), time.perf_counter()
            with f.cpu().measure() as used:
                per_conv = await asyncio.gather(*(conversation(session, target, c, s, t0)
                                                  for c, s in zip(conversations, starts)))
            wall = time.perf_counter() - t0
            cpu, after = cpu_rates(used, wall), f.backend_counters()
    results = [r for conv in per_conv for r in conv]
    rate, hits, queries = hit_rate(before, after)
    later = [r for r in results if r.turn > 0]
    row = {"strategy": label, "requests": len(results), "ok": sum(r.ok for r in results),
           "failed": sum(not r.ok for r in results), "hit_rate": rate, "hit_tokens": hits, "query_tokens": queries,
           "wall_s": wall, **latency_stats(results),
           "p50_ttft_later_turns_ms": latency_stats(later)["p50_ttft_ms"], **cpu,
           "backends": sorted(collections.Counter(r.headers.get("x-gateway-backend", "?") for r in results).items())}
    env.log(f"  {label}: hit rate {rate:.1%}, TTFT p50 {row['p50_ttft_ms']:.0f} p99 {row['p99_ttft_ms']:.0f} ms, "
            f"{row['failed']} failed, {wall:.0f} s")
    return row
