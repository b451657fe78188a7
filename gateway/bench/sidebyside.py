"""Compare request paths to one backend: added latency at a fixed load, and a rate search.

A path is a `Target` plus the pid of the proxy process in front of the backend (None for the
direct path). Added latency = a percentile of the path minus the same percentile direct, measured
in interleaved rounds so drift on a shared machine hits every path alike. The rate search finds
the highest Poisson rate at which p99 TTFT and p99 E2E stay within `slo_ms` of direct's at the
same rate, with no failed request: doubling from a start rate, then bisection (geometric).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.bench.arrivals import Arrivals, offsets_within
from gateway.bench.cpu import CpuProbe, CpuReader, per_request_us
from gateway.bench.runner import RunResult, Target, merge_runs, run_closed_loop, run_open_loop
from gateway.bench.summary import Summary, summarize
from gateway.bench.workload import RequestSpec

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class BenchPath:
    name: str
    target: Target
    pid: int | None = None  # the proxy process whose CPU is charged to this path


async def warm_up(path: BenchPath, specs: Sequence[RequestSpec], concurrency: int = 8) -> None:
    """Connections, caches (a cache-on path sees every spec once): closed loop over `specs`."""
    await run_closed_loop(path.target, specs, concurrency)


async def probe(path: BenchPath, specs: Sequence[RequestSpec], rate: float, seconds: float,
                seed: int = 0) -> RunResult:
    """Poisson arrivals at `rate` for `seconds` (specs cycled)."""
    times = offsets_within(Arrivals("poisson", rate, seed=seed), seconds)
    chosen = [specs[i % len(specs)] for i in range(len(times))]
    return await run_open_loop(path.target, chosen, times, duration_s=seconds, drain_s=max(10.0, seconds))


def _note(run: RunResult) -> str:
    tiers = collections.Counter(r.headers.get("x-gateway-tier", "") for r in run.results if r.ok)
    hits = sum(r.headers.get("x-gateway-cache") == "hit" for r in run.results)
    parts = [f"n={len(run.results)}, failed={sum(not r.ok for r in run.results)}"]
    if tiers.keys() - {""}:
        total = sum(tiers.values())
        parts.append("tiers " + " / ".join(f"{k} {100 * v / total:.0f}%" for k, v in sorted(tiers.items())))
    if hits:
        parts.append(f"cache hits {100 * hits / len(run.results):.0f}%")
    return ", ".join(parts)


def added_row(name: str, s: Summary, direct: Summary) -> dict[str, Any]:
    """Path minus direct at p50 and p99, TTFT and E2E, in ms."""
    return {"path": name, **{f"added_{m}_{q}": float(s[f"{p}_{k}_ms"]) - float(direct[f"{p}_{k}_ms"])
                             for m, k in (("ttft", "ttft"), ("e2e", "e2el"))
                             for q, p in (("p50", "median"), ("p99", "p99"))}}


async def added_latency(paths: Sequence[BenchPath], specs: Sequence[RequestSpec], rate: float, seconds: float,
                        rounds: int, cpu: CpuReader, log: Log) -> list[dict[str, Any]]:
    """Rows: per path, added TTFT/E2E p50/p99 vs paths[0] (direct) and CPU µs per request."""
    runs: dict[str, list[RunResult]] = {p.name: [] for p in paths}
    cpu_s: dict[str, float] = {p.name: 0.0 for p in paths}
    for rnd in range(rounds):
        for p in paths if rnd % 2 == 0 else paths[::-1]:
            with CpuProbe({p.name: p.pid}, cpu).measure() as used:
                runs[p.name].append(await probe(p, specs, rate, seconds, seed=rnd))
            cpu_s[p.name] += used[p.name]
    merged = {k: merge_runs(v) for k, v in runs.items()}
    direct = summarize(merged[paths[0].name])
    rows = []
    for p in paths:
        run, s = merged[p.name], summarize(merged[p.name])
        row = added_row(p.name, s, direct) | {"p50_ttft_ms": s["median_ttft_ms"], "p99_ttft_ms": s["p99_ttft_ms"],
                                              "p50_e2el_ms": s["median_e2el_ms"], "p99_e2el_ms": s["p99_e2el_ms"],
                                              "note": _note(run), "failed": s["failed"]}
        row["cpu_us"] = per_request_us(cpu_s[p.name], len(run.results)) if p.pid and run.results else None
        rows.append(row)
        log(f"  {p.name:<18} TTFT p50 {s['median_ttft_ms']:8.2f} p99 {s['p99_ttft_ms']:8.2f} ms  "
            f"E2E p50 {s['median_e2el_ms']:8.2f} p99 {s['p99_e2el_ms']:8.2f} ms  {row['note']}")
    return rows


Probes = dict[tuple[str, float], dict[str, Any]]  # (path name, rate) -> probe row, shared across SLOs


async def probe_pair(direct: BenchPath, path: BenchPath, specs: Sequence[RequestSpec], rate: float,
                     seconds: float) -> dict[str, Any]:
    """One probe of the rate search: direct, then the path, at `rate`; the added p99s."""
    d = summarize(await probe(direct, specs, rate, seconds))
    s = summarize(await probe(path, specs, rate, seconds))
    return added_row(path.name, s, d) | {"rate": rate, "failed": s["failed"], "completed": s["completed"],
                                         "direct_failed": d["failed"], "direct_p99_ttft_ms": d["p99_ttft_ms"]}


def passes(row: dict[str, Any], slo_ms: float) -> bool:
    worst = max(row["added_ttft_p99"], row["added_e2e_p99"])
    return bool(row["failed"] == 0 and row["completed"] > 0 and worst <= slo_ms)


@dataclass(slots=True)
class RateSearch:
    """The rate search of one path against direct. `baseline_p99_ms`: direct's p99 TTFT at low load;
    once direct's own p99 passes 2x that + 10 ms (load generator or backend saturated), added
    latency means nothing and the search stops there ("capped")."""

    direct: BenchPath
    specs: Sequence[RequestSpec]
    seconds: float
    baseline_p99_ms: float
    log: Log
    probes: Probes

    def degraded(self, row: dict[str, Any]) -> bool:
        return bool(row["direct_failed"]) or row["direct_p99_ttft_ms"] > 2 * self.baseline_p99_ms + 10

    async def row(self, path: BenchPath, rate: float) -> dict[str, Any]:
        key = (path.name, round(rate, 3))
        if key not in self.probes:
            row = self.probes[key] = await probe_pair(self.direct, path, self.specs, rate, self.seconds)
            self.log(f"  {path.name:<18} {rate:8.1f} req/s: added p99 TTFT {row['added_ttft_p99']:+8.2f} E2E "
                     f"{row['added_e2e_p99']:+8.2f} ms, failed {row['failed']}"
                     + (" (direct degraded)" if self.degraded(row) else ""))
        return self.probes[key]

    async def run(self, path: BenchPath, *, start: float, max_rate: float, slo_ms: float,
                  bisect: int) -> dict[str, Any]:
        """{"rate": highest passing rate (0: none down to 1 req/s), "capped": why it stopped early}."""
        lo, hi, rate, capped = 0.0, math.inf, start, ""
        while math.isinf(hi) and not capped:
            if rate > max_rate:
                capped = f"--max-rate {max_rate:g}"
                break
            row = await self.row(path, rate)
            if self.degraded(row):
                capped = f"direct degraded at {rate:g} req/s"
            elif passes(row, slo_ms):
                lo, rate = rate, rate * 2
            elif lo == 0.0 and rate / 2 >= 1.0:
                hi, rate = rate, rate / 2  # below the start rate: keep halving until one passes
                while rate >= 1.0 and lo == 0.0:
                    if passes(await self.row(path, rate), slo_ms):
                        lo = rate
                    else:
                        hi, rate = rate, rate / 2
            else:
                hi = rate
        for _ in range(bisect if lo and not capped else 0):
            mid = math.sqrt(lo * hi)
            row = await self.row(path, mid)
            if passes(row, slo_ms) and not self.degraded(row):
                lo = mid
            else:
                hi = mid
        return {"rate": lo, "capped": capped, "first_over": None if math.isinf(hi) else hi, "slo_ms": slo_ms}
