"""Phases: named closed-loop runs of prepared non-streaming request bodies, with the CPU seconds the
process under test (the gateway) used meanwhile, summarized as latency percentiles and CPU per request."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from gateway.bench.client import RequestResult, send_json
from gateway.bench.cpu import CpuProbe, per_request_us
from gateway.bench.runner import RunResult, closed_loop, merge_runs
from gateway.bench.summary import percentile

TIMEOUT = aiohttp.ClientTimeout(total=60, sock_read=30)


def json_session() -> aiohttp.ClientSession:
    """A session for phases: no connection cap, 60 s per request."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT)


@dataclass
class Phase:
    """The outcome of one closed-loop run."""

    name: str
    concurrency: int
    run: RunResult
    gateway_cpu_s: float | None = None  # CPU seconds of the probed process during the run
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def samples(self) -> list[RequestResult]:
        return self.run.results

    @property
    def wall_s(self) -> float:
        return self.run.duration_s

    @property
    def truncated(self) -> bool:
        return self.run.truncated


async def json_phase(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], bodies: Sequence[bytes],
                     concurrency: int, time_limit_s: float, name: str = "", cpu_pid: int | None = None) -> Phase:
    """`concurrency` workers send `bodies` in order, back to back (no think time), each the next body
    not yet taken; stops early after `time_limit_s`. `cpu_pid`: CPU seconds of that process are recorded."""

    async def sender(i: int) -> RequestResult:
        return await send_json(session, url, bodies[i], headers)

    with CpuProbe({"probed": cpu_pid}).measure() as used:
        run = await closed_loop(sender, len(bodies), concurrency, duration_s=time_limit_s)
    return Phase(name, concurrency, run, used["probed"] if cpu_pid else None)


class Budget:
    """A run's time budget: each phase gets at most `phase_limit_s` and what is left; once it is spent,
    later phases are skipped (named in `skipped`, and said with `log` when given)."""

    def __init__(self, budget_s: float, phase_limit_s: float, log: Callable[[str], None] | None = None) -> None:
        self.budget_s, self.phase_limit_s, self.log = budget_s, phase_limit_s, log
        self.deadline = time.monotonic() + budget_s
        self.skipped: list[str] = []

    def limit(self) -> float:
        return max(1.0, min(self.phase_limit_s, self.deadline - time.monotonic()))

    def spent(self, what: str) -> bool:
        """Whether the budget is spent (then `what` is skipped)."""
        if time.monotonic() <= self.deadline:
            return False
        self.skipped.append(what)
        if self.log:
            self.log(f"  SKIPPED {what}: the run's time budget ({self.budget_s:.0f} s) is spent")
        return True


def merge_phases(parts: Sequence[Phase]) -> Phase:
    """Phases of one name and concurrency measured in rounds, as one (CPU summed, None if never probed)."""
    cpu = [p.gateway_cpu_s for p in parts if p.gateway_cpu_s is not None]
    return Phase(parts[0].name, parts[0].concurrency, merge_runs([p.run for p in parts]), sum(cpu) if cpu else None)


def phase_summary(phase: Phase, only: Iterable[RequestResult] | None = None) -> dict[str, Any]:
    """n, errors, rps, latency percentiles (ms) of the phase (or of `only`, a subset of its samples)."""
    chosen = list(only) if only is not None else phase.samples
    good = [s.e2e_s * 1e3 for s in chosen if s.ok]
    n, wall = len(phase.samples), phase.wall_s
    out: dict[str, Any] = {
        "name": phase.name, "concurrency": phase.concurrency, "n": len(chosen),
        "errors": sum(not s.ok for s in chosen), "wall_s": round(wall, 3),
        "rps": n / wall if wall else float("nan"), "truncated": phase.truncated,
        "p50_ms": percentile(good, 50), "p90_ms": percentile(good, 90), "p99_ms": percentile(good, 99),
        "max_ms": max(good) if good else float("nan"), "mean_ms": float(np.mean(good)) if good else float("nan"),
        "error_samples": sorted({s.error or str(s.status) for s in chosen if not s.ok})[:3],
    }
    if phase.gateway_cpu_s is not None and n:
        out["gateway_cpu_us_per_req"] = per_request_us(phase.gateway_cpu_s, n)
        out["gateway_core_util"] = phase.gateway_cpu_s / wall if wall else float("nan")
    return out
