"""Live statistics of one replica, and the time to first token it predicts for a new request.

    predicted TTFT = a + b × work  +  waiting × E2E / running
    work           = prompt tokens of requests prefilling ahead of it + its own uncached tokens

`a` (fixed overhead: network, scheduling, a decode step, queues we cannot see) and `b` (seconds
per prefill token) are fitted online to this replica's observed TTFTs by least squares with
exponential forgetting; until the prompts seen vary enough in length, `b` is the tier's
`prefill_tokens_per_s` hint. The last term is the backend's own queue (Little's law: `ahead`
requests before it, a slot freeing every E2E / slots seconds): `waiting` from its /metrics when two
scrapes in a row show one (a continuous batcher shows a request or two waiting for the next step
now and then: not a queue), or, sooner, this gateway's own requests beyond the replica's batch
slots (the tier's `slots_per_replica`, vLLM's --max-num-seqs). A replica
not tried yet borrows its tier's mean overhead, else it would never be tried. Streaming traffic is
ranked on TTFT itself, never on TTFT divided by output tokens.

Samples are TTFTs only: a stream's first byte, or for a non-streamed answer its end minus the decode
time the server itself reports (llama.cpp's `timings.predicted_ms`, `server_decode_s`). A non-streamed
answer without such timings teaches the fit nothing (its end is not a first token: taking it for one made
a replica that once answered a long non-streamed request look slow forever); it still counts in E2E.
Old samples fade with time as well as with new samples: a sample that comes `gap` seconds after the
previous one weighs at least 1 - exp(-gap / stale_s), so a replica probed again after a while
(`ReplicaPool.rank`'s exploration) is judged on what it does now, not on one bad sample long ago.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.backends.breaker import CircuitBreaker
from gateway.reading import CHARS_PER_TOKEN

DEFAULT_PREFILL_TPS = 4000.0
DEFAULT_OVERHEAD_S = 0.01
MIN_WORK_SPREAD = 64.0  # tokens: below this standard deviation of work, the slope is not fitted
MIN_WORK_VARIANCE = MIN_WORK_SPREAD ** 2
SCRAPE_STALE_S = 10.0
PREFILL_SENT_MIN = 200  # tokens sent between two scrapes before their prefill ratio counts
PREFILL_RATIO_MIN, PREFILL_RATIO_MAX, PREFILL_RATIO_ALPHA = 0.02, 4.0, 0.3


def estimate_tokens(chars: int) -> int:
    """A prompt's token count guessed from its length (routing needs it before any tokenizer runs)."""
    return max(1, chars // CHARS_PER_TOKEN)


def ewma(old: float | None, sample: float, alpha: float) -> float:
    return sample if old is None else old + alpha * (sample - old)


def server_decode_s(answer: Mapping[str, Any]) -> float | None:
    """The seconds a non-streamed answer spent decoding, as the server reports it (llama.cpp's
    `timings.predicted_ms`); None when it does not say."""
    timings = answer.get("timings")
    decode_ms = timings.get("predicted_ms") if type(timings) is dict else None  # (decoded JSON: no ABC check)
    if isinstance(decode_ms, (int, float)) and not isinstance(decode_ms, bool) and 0 <= decode_ms < math.inf:
        return decode_ms / 1000
    return None


def sample_weight(alpha: float, gap_s: float | None, stale_s: float) -> float:
    """The weight of a new sample `gap_s` after the previous one: `alpha`, or more when the previous
    samples are old (1 - exp(-gap / stale_s)); `stale_s` 0: `alpha` only."""
    if gap_s is None or stale_s <= 0:
        return alpha
    return max(alpha, 1.0 - math.exp(-gap_s / stale_s))


@dataclass(slots=True)
class BackendLoad:
    """What the replica says about itself on /metrics (vLLM names), and when it said it."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    at: float = 0.0
    streak: int = 0  # scrapes in a row, this one included, that showed requests waiting
    prompt_tokens: float | None = None  # prompt tokens the server prefilled since it started (llama.cpp's counter)

    def fresh(self, now: float) -> bool:
        return self.at > 0 and now - self.at < SCRAPE_STALE_S


@dataclass(slots=True)
class TtftFit:
    """TTFT ≈ a + b × work, fitted from EWMA moments (exponential forgetting). The slope is refitted at
    each sample (predictions, many per sample, only read it)."""

    samples: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    mean_xx: float = 0.0
    mean_xy: float = 0.0
    _fitted: float | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._fitted = self._fit_slope()

    def add(self, work: float, ttft_s: float, alpha: float) -> None:
        weight = 1.0 if self.samples == 0 else alpha
        self.samples += 1
        self.mean_x += weight * (work - self.mean_x)
        self.mean_y += weight * (ttft_s - self.mean_y)
        self.mean_xx += weight * (work * work - self.mean_xx)
        self.mean_xy += weight * (work * ttft_s - self.mean_xy)
        self._fitted = self._fit_slope()

    def _fit_slope(self) -> float | None:
        """The least-squares slope of the moments; None while too few samples or too little spread of work."""
        if self.samples < 3:
            return None
        variance = self.mean_xx - self.mean_x ** 2
        if variance < MIN_WORK_VARIANCE:
            return None
        slope = (self.mean_xy - self.mean_x * self.mean_y) / variance
        return slope if slope > 0.0 else 0.0

    def slope(self, prior: float) -> float:
        return prior if self._fitted is None else self._fitted

    def overhead(self, slope: float) -> float | None:
        if self.samples == 0:
            return None
        overhead = self.mean_y - slope * self.mean_x
        return overhead if overhead > 0.0 else 0.0


@dataclass(slots=True)
class ReplicaStats:
    prefill_tps: float = DEFAULT_PREFILL_TPS  # the tier's hint
    in_flight: int = 0
    last_pick: int = 0
    pending_tokens: int = 0  # prompt tokens of this gateway's requests still waiting for their first byte
    pending: int = 0  # ... and those requests
    sent: int = 0  # attempts sent to it since the gateway started
    ttft_s: float | None = None  # EWMAs of what this gateway observed
    ttft_dev_s: float | None = None  # ... and of how far each TTFT fell from the one before (its noise)
    tpot_s: float | None = None
    e2e_s: float | None = None
    fit: TtftFit = field(default_factory=TtftFit)
    sampled_at: float | None = None  # time.monotonic() of the last TTFT sample
    picked_at: float = 0.0  # time.monotonic() of the last request sent to it (0: none yet)
    probed_at: float = 0.0  # ... of the last time the ranking put it first to try it again (exploration)
    failures: int = 0  # failed attempts since start
    error_rate: float = 0.0  # EWMA of 1 per failed attempt, 0 per good one
    healthy: bool = True  # the last active health check passed
    checked_at: float = 0.0  # time.monotonic() of the last active health check (0: none yet)
    slots: int | None = None  # requests the backend runs at once (the tier's slots_per_replica)
    sent_tokens: int = 0  # prompt tokens (the gateway's estimates, warm prefixes left out) sent to it since start
    prefill_ratio: float | None = None  # tokens it prefills per token sent (calibrated from its /metrics; None: 1)
    predicted_ewma_s: float | None = None  # EWMA of the TTFT predicted for the requests whose TTFT was seen
    _scraped: tuple[float, int] | None = None  # (its prefilled-tokens counter, sent_tokens) at the last scrape
    load: BackendLoad = field(default_factory=BackendLoad)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)

    @property
    def tried(self) -> bool:
        """Its own TTFT fit has a sample (else predictions borrow the tier's mean overhead)."""
        return self.fit.samples > 0

    @property
    def overhead_s(self) -> float | None:
        """The fitted fixed part of TTFT (None before the first sample)."""
        return self.fit.overhead(self.fit.slope(1 / self.prefill_tps))

    def work(self, tokens: int, cached_tokens: int = 0) -> float:
        """Prefill tokens ahead of a new request, and its own, as the server prefills them (`prefill_ratio`)."""
        own = tokens - cached_tokens  # none when the warm prefix covers the whole prompt
        work = self.pending_tokens + (own if own > 0 else 0)
        return work if self.prefill_ratio is None else work * self.prefill_ratio

    def queue_s(self, now: float | None = None) -> float:
        """The wait in the backend's own queue: what its last fresh /metrics said, or what this
        gateway alone has sent beyond its batch slots, whichever is longer."""
        load, e2e = self.load, self.e2e_s or 1.0
        reported = 0.0
        if load.waiting > 0 and load.streak >= 2 and load.fresh(time.monotonic() if now is None else now):
            reported = load.waiting * e2e / max(1.0, load.running)
        if self.slots is None or self.in_flight < self.slots:
            return reported  # no queue of our own
        own = (self.in_flight - self.slots + 1) * e2e / self.slots
        return max(reported, own)

    def observe_load(self, load: BackendLoad) -> None:
        """A scrape of the backend's /metrics; counts the scrapes in a row that showed a queue, and calibrates
        `prefill_ratio` from its prefilled-tokens counter."""
        load.streak = self.load.streak + 1 if load.waiting > 0 else 0
        self.load = load
        if load.prompt_tokens is not None:
            self.calibrate(load.prompt_tokens)

    def calibrate(self, prefilled_total: float) -> None:
        """The tokens the server says it prefilled since the last scrape over the tokens this gateway sent it
        meanwhile (estimated from characters, warm prefixes left out): what the server's prompt cache saves, its
        chat template adds and its tokenizer counts differently. Learned once PREFILL_SENT_MIN tokens were sent
        (another gateway sending to it too would inflate it: a share of the fleet's traffic, still calibrated)."""
        scraped, self._scraped = self._scraped, (prefilled_total, self.sent_tokens)
        if scraped is None:
            return
        prefilled, sent = prefilled_total - scraped[0], self.sent_tokens - scraped[1]
        if prefilled < 0:
            return  # the server restarted: its counter starts over from this scrape
        if sent < PREFILL_SENT_MIN:
            self._scraped = scraped  # too little sent yet: the next scrape takes a longer span
            return
        ratio = min(PREFILL_RATIO_MAX, max(PREFILL_RATIO_MIN, prefilled / sent))
        self.prefill_ratio = ewma(self.prefill_ratio, ratio, PREFILL_RATIO_ALPHA)

    def predict_ttft(self, tokens: int, cached_tokens: int = 0, prior_overhead_s: float | None = None) -> float:
        slope = self.fit.slope(1 / self.prefill_tps)
        overhead = self.fit.overhead(slope)
        if overhead is None:
            overhead = DEFAULT_OVERHEAD_S if prior_overhead_s is None else prior_overhead_s
        return overhead + slope * self.work(tokens, cached_tokens) + self.queue_s()

    def available(self) -> bool:
        return self.healthy and self.breaker.available()

    def retry_in(self, health_interval_s: float, now: float | None = None) -> float:
        """Seconds until it may be tried again: its circuit's cooldown, and, failing its health checks,
        the next check (`health_interval_s` after the last one); 0 when it may be tried now."""
        now = time.monotonic() if now is None else now
        wait = self.breaker.retry_in(now)
        if not self.healthy and health_interval_s > 0:
            since = now - self.checked_at if self.checked_at else 0.0
            wait = max(wait, health_interval_s - since)
        return max(0.0, wait)

    def observe_ttft(self, observed_s: float, work: float, queue_s: float, alpha: float, stale_s: float = 0.0,
                     now: float | None = None, predicted_s: float | None = None) -> None:
        """One TTFT seen for a request that had `work` prefill tokens and `queue_s` backend queue ahead,
        weighed more when the last sample is old (`sample_weight`). Only requests sent with no queue
        ahead teach the fit: a queue's length is a guess, and the fit must not mistake a passing queue
        for the replica's own overhead."""
        now = time.monotonic() if now is None else now
        weight = sample_weight(alpha, None if self.sampled_at is None else now - self.sampled_at, stale_s)
        self.sampled_at = now
        if self.ttft_s is not None:
            self.ttft_dev_s = ewma(self.ttft_dev_s, abs(observed_s - self.ttft_s), weight)
        self.ttft_s = ewma(self.ttft_s, observed_s, weight)
        if predicted_s is not None:  # the same requests' predictions: predicted against measured, like for like
            self.predicted_ewma_s = ewma(self.predicted_ewma_s, predicted_s, weight)
        if queue_s == 0:
            self.fit.add(work, observed_s, weight)

    def observe_finish(self, e2e_s: float, tpot_s: float | None, failed: bool, alpha: float) -> None:
        self.error_rate = ewma(self.error_rate, 1.0 if failed else 0.0, alpha)
        if failed:
            self.failures += 1
            return
        self.e2e_s = ewma(self.e2e_s, e2e_s, alpha)
        if tpot_s is not None:
            self.tpot_s = ewma(self.tpot_s, tpot_s, alpha)
