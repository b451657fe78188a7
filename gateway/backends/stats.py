"""Live statistics of one replica, and the time to first token it predicts for a new request.

    raw TTFT  = base + (prompt tokens prefilling ahead + own uncached tokens) / prefill rate
                + waiting × E2E / running          (the backend's own queue, when it reports one)
    predicted = calibration × raw TTFT

`prefill rate` starts from the tier's `prefill_tokens_per_s` hint; `calibration` is an EWMA of
observed / raw TTFT over this replica's recent requests, so a wrong hint, a slower machine or
load from other gateways show up within a few requests; a replica not tried yet borrows its tier's
mean (else it would never be tried). `base` is one decode step (EWMA TPOT).
Streaming traffic is ranked on TTFT itself, never on TTFT divided by output tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.backends.breaker import CircuitBreaker

DEFAULT_PREFILL_TPS = 4000.0
DEFAULT_STEP_S = 0.01
CALIBRATION_RANGE = (0.1, 50.0)
SCRAPE_STALE_S = 10.0
CHARS_PER_TOKEN = 4


def estimate_tokens(chars: int) -> int:
    """A prompt's token count guessed from its length (routing needs it before any tokenizer runs)."""
    return max(1, chars // CHARS_PER_TOKEN)


def ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else old + alpha * (sample - old)


@dataclass(slots=True)
class BackendLoad:
    """What the replica says about itself on /metrics (vLLM names), and when it said it."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    at: float = 0.0

    def fresh(self, now: float) -> bool:
        return self.at > 0 and now - self.at < SCRAPE_STALE_S


@dataclass(slots=True)
class ReplicaStats:
    prefill_tps: float = DEFAULT_PREFILL_TPS
    in_flight: int = 0
    last_pick: int = 0
    pending_tokens: int = 0  # prompt tokens of this gateway's requests still waiting for their first byte
    ttft_s: float | None = None  # EWMAs of what this gateway observed
    tpot_s: float | None = None
    e2e_s: float | None = None
    calibration: float | None = None  # None until the first TTFT sample
    failures: int = 0  # failed attempts since start
    error_rate: float = 0.0  # EWMA of 1 per failed attempt, 0 per good one
    healthy: bool = True  # the last active health check passed
    load: BackendLoad = field(default_factory=BackendLoad)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    def raw_ttft(self, tokens: int, cached_tokens: int = 0, now: float | None = None) -> float:
        """The model's TTFT before calibration, in seconds (see the module docstring)."""
        base = self.tpot_s if self.tpot_s is not None else DEFAULT_STEP_S
        work = self.pending_tokens + max(0, tokens - cached_tokens)
        raw = base + work / self.prefill_tps
        load = self.load
        if load.waiting > 0 and load.fresh(time.monotonic() if now is None else now):
            raw += load.waiting * (self.e2e_s or 1.0) / max(1.0, load.running)
        return raw

    def predict_ttft(self, tokens: int, cached_tokens: int = 0, prior: float = 1.0) -> float:
        calibration = prior if self.calibration is None else self.calibration
        return calibration * self.raw_ttft(tokens, cached_tokens)

    def available(self) -> bool:
        return self.healthy and self.breaker.available()

    def observe_ttft(self, observed_s: float, raw_s: float, alpha: float) -> None:
        self.ttft_s = ewma(self.ttft_s, observed_s, alpha)
        low, high = CALIBRATION_RANGE
        ratio = min(high, max(low, observed_s / max(raw_s, 1e-6)))
        self.calibration = ewma(self.calibration, ratio, alpha)

    def observe_finish(self, e2e_s: float, tpot_s: float | None, failed: bool, alpha: float) -> None:
        self.error_rate = ewma(self.error_rate, 1.0 if failed else 0.0, alpha)
        if failed:
            self.failures += 1
            return
        self.e2e_s = ewma(self.e2e_s, e2e_s, alpha)
        if tpot_s is not None:
            self.tpot_s = ewma(self.tpot_s, tpot_s, alpha)
