"""An adaptive concurrency limit: Netflix concurrency-limits' Gradient2, also steered by a TTFT target.

Each sample is one request's TTFT, measured from its admission (queue time excluded):

    short    = EWMA of recent TTFT (about 10 requests)
    long     = EWMA of TTFT over about 200 requests (the no-queue baseline; decays toward short)
    gradient = clamp((TOLERANCE × long + SLACK) / short, 0.5, 1), and at most target / short above
               the target
    limit    = (1 − SMOOTHING) × limit + SMOOTHING × (gradient × limit + √limit)

So the limit grows by about √limit per sample while TTFT stays near its baseline and under the
target, and shrinks (at most halving) as soon as queueing shows up in TTFT. `SLACK` keeps jitter
on a fast backend (12 ms TTFT becoming 150 ms for a few requests: CPU noise, not a queue) from
ratcheting its limit down; a queue shows up as hundreds of milliseconds that last. It does not
grow while less than half of it is used (no evidence that more would be fine).
"""

from __future__ import annotations

import math

from gateway.backends.stats import ewma
from gateway.config.routes import Admission

SHORT_ALPHA = 0.2
LONG_ALPHA = 0.005
TOLERANCE = 1.5
SLACK_S = 0.05
SMOOTHING = 0.2
MIN_GRADIENT = 0.5


class GradientLimit:
    __slots__ = ("limit", "short_s", "long_s")

    def __init__(self, initial: int) -> None:
        self.limit = float(initial)
        self.short_s: float | None = None
        self.long_s: float | None = None

    @property
    def slots(self) -> int:
        slots = int(self.limit)
        return slots if slots > 1 else 1

    def on_sample(self, ttft_s: float, in_flight: int, settings: Admission) -> None:
        ttft_s = max(ttft_s, 1e-4)
        short = self.short_s = ewma(self.short_s, ttft_s, SHORT_ALPHA)
        long = self.long_s = ewma(self.long_s, ttft_s, LONG_ALPHA)
        if long / short > 2:
            self.long_s = long = long * 0.95  # the baseline was set under a heavier load: let it fall
        target = settings.ttft_target_ms / 1000
        gradient = max(MIN_GRADIENT, min(1.0, (TOLERANCE * long + SLACK_S) / short))
        if short > target:
            gradient = min(gradient, max(MIN_GRADIENT, target / short))
        if gradient >= 1.0 and in_flight < self.limit / 2:
            return  # the limit is not what holds traffic back: no evidence it could be higher
        proposed = self.limit * gradient + math.sqrt(self.limit)
        smoothed = (1 - SMOOTHING) * self.limit + SMOOTHING * proposed
        self.limit = min(float(settings.max_limit), max(float(settings.min_limit), smoothed))
