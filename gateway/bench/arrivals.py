"""Arrival schedules: send-time offsets (seconds from the start) for open-loop load.

`poisson` draws gaps from a gamma distribution of mean 1/rate, as `vllm bench serve` does:
burstiness 1 is a Poisson process (exponential gaps), below 1 burstier, above 1 more regular.
`constant` spaces requests exactly 1/rate apart. A closed loop (fixed concurrency) needs no
schedule: the runner sends the next request when one ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Kind = Literal["poisson", "constant", "closed"]


@dataclass(frozen=True, slots=True)
class Arrivals:
    """How requests arrive: `kind`, the rate (req/s) for open loops, the concurrency for closed."""

    kind: Kind
    rate: float = math.inf
    concurrency: int = 1
    burstiness: float = 1.0
    seed: int = 0

    def label(self) -> str:
        if self.kind == "closed":
            return f"concurrency {self.concurrency}"
        return f"{self.kind} {self.rate:g} req/s" if math.isfinite(self.rate) else "all at once"


def poisson_offsets(n: int, rate: float, seed: int = 0, burstiness: float = 1.0) -> list[float]:
    """`n` offsets starting at 0, gaps gamma(shape=burstiness, mean=1/rate); rate inf: all at 0."""
    if n <= 0:
        return []
    if not math.isfinite(rate):
        return [0.0] * n
    if rate <= 0 or burstiness <= 0:
        raise ValueError("rate and burstiness must be > 0")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def constant_offsets(n: int, rate: float) -> list[float]:
    """`n` offsets exactly 1/rate apart; rate inf: all at 0."""
    if not math.isfinite(rate):
        return [0.0] * max(n, 0)
    if rate <= 0:
        raise ValueError("rate must be > 0")
    return [i / rate for i in range(max(n, 0))]


def offsets(arrivals: Arrivals, n: int) -> list[float]:
    """The schedule of `n` open-loop requests."""
    if arrivals.kind == "poisson":
        return poisson_offsets(n, arrivals.rate, arrivals.seed, arrivals.burstiness)
    if arrivals.kind == "constant":
        return constant_offsets(n, arrivals.rate)
    raise ValueError("a closed loop has no schedule")


def offsets_within(arrivals: Arrivals, duration_s: float) -> list[float]:
    """The schedule's offsets before `duration_s`: for Poisson a random count, about rate x duration."""
    if not math.isfinite(arrivals.rate) or arrivals.kind == "closed":
        raise ValueError("a duration bound needs a finite open-loop rate")
    n = max(1, math.ceil(arrivals.rate * duration_s))
    while True:
        times = offsets(arrivals, 2 * n + 10)
        if times[-1] >= duration_s:
            return [t for t in times if t < duration_s]
        n *= 2
