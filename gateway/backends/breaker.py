"""A circuit breaker per replica: closed → open after `failures` in a row → half-open after the cooldown.

Half-open lets one trial request through: success closes the circuit, failure opens it again with
the cooldown doubled (up to `max_cooldown_s`). An open replica is not tried at all (fail fast).
"""

from __future__ import annotations

import time
from typing import Literal

from gateway.config.routes import Breaker

BreakerState = Literal["closed", "open", "half_open"]
STATE_CODES: dict[BreakerState, int] = {"closed": 0, "open": 1, "half_open": 2}


class CircuitBreaker:
    __slots__ = ("state", "consecutive_failures", "opened_at", "cooldown_s", "_trial_in_flight")

    def __init__(self) -> None:
        self.state: BreakerState = "closed"
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.cooldown_s = 0.0
        self._trial_in_flight = False

    def available(self, now: float | None = None) -> bool:
        """May a request be sent now (without taking the half-open trial)?"""
        if self.state == "closed":
            return True
        if self.state == "half_open":
            return not self._trial_in_flight
        return (time.monotonic() if now is None else now) - self.opened_at >= self.cooldown_s

    def retry_in(self, now: float | None = None) -> float:
        """Seconds until an open circuit lets a trial through (0 when it does now)."""
        if self.state != "open":
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - (time.monotonic() if now is None else now))

    def on_send(self) -> None:
        """A request goes to the replica: past the cooldown, it is the half-open trial."""
        if self.state == "open" and self.available():
            self.state = "half_open"
        if self.state == "half_open":
            self._trial_in_flight = True

    def on_success(self) -> None:
        self.state, self.consecutive_failures, self._trial_in_flight = "closed", 0, False

    def on_failure(self, settings: Breaker) -> None:
        self.consecutive_failures += 1
        self._trial_in_flight = False
        if self.state == "half_open":
            self._open(min(settings.max_cooldown_s, max(self.cooldown_s, settings.cooldown_s) * 2))
        elif self.state == "closed" and self.consecutive_failures >= settings.failures:
            self._open(settings.cooldown_s)

    def _open(self, cooldown_s: float) -> None:
        self.state, self.opened_at, self.cooldown_s = "open", time.monotonic(), cooldown_s
