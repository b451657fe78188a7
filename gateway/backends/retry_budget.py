"""A retry budget (Finagle's RetryBudget, Envoy's retry_budget): failover attempts are allowed while
retries stay under `ratio` of the requests of the last `window_s` seconds, plus `min_per_s`.

A fleet in trouble then sees at most (1 + ratio) times its normal load, not max_attempts times.
"""

from __future__ import annotations

import math
import time

from gateway.config.routes import RetryBudget as Settings

BUCKET_S = 1.0


class RetryBudget:
    def __init__(self) -> None:
        self._requests: dict[int, int] = {}
        self._retries: dict[int, int] = {}

    def on_request(self, now: float | None = None) -> None:
        self._add(self._requests, now)

    def try_retry(self, settings: Settings, now: float | None = None) -> bool:
        """Take one retry from the budget; False when it is spent."""
        now = time.monotonic() if now is None else now
        requests = self._sum(self._requests, settings.window_s, now)
        retries = self._sum(self._retries, settings.window_s, now)
        if retries >= settings.ratio * requests + settings.min_per_s * settings.window_s:
            return False
        self._add(self._retries, now)
        return True

    def _add(self, buckets: dict[int, int], now: float | None) -> None:
        key = math.floor((time.monotonic() if now is None else now) / BUCKET_S)
        buckets[key] = buckets.get(key, 0) + 1
        if len(buckets) > 120:
            for old in sorted(buckets)[:-60]:
                del buckets[old]

    def _sum(self, buckets: dict[int, int], window_s: float, now: float) -> int:
        oldest = math.floor((now - window_s) / BUCKET_S)
        return sum(count for key, count in buckets.items() if key > oldest)
