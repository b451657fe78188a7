"""Replica choice inside a tier: the lowest predicted time to first token, power of two choices
among near-ties, exploration (a replica passed over for `explore_after_s` is tried again), and the
bookkeeping (`Lease`) that keeps each replica's live statistics."""

from __future__ import annotations

import itertools
import random
import time

from gateway.backends.retry_budget import RetryBudget
from gateway.backends.stats import DEFAULT_PREFILL_TPS, ReplicaStats
from gateway.config import Replica, RoutesConfig, Tier
from gateway.config.routes import Balancing

NEAR_TIE_FLOOR_S = 0.001


class ReplicaPool:
    """Live statistics of every replica (by name, so they outlive config reloads) and the ranking."""

    def __init__(self, seed: int | None = None) -> None:
        self._states: dict[str, ReplicaStats] = {}
        self._picks = itertools.count(1)
        self._turn = 0  # round robin: where the next ranking starts
        self._random = random.Random(seed)
        self.retries = RetryBudget()

    def state(self, replica: Replica, tier: Tier | None = None) -> ReplicaStats:
        """The replica's statistics; a replica seen for the first time takes its tier's settings."""
        state = self._states.get(replica.name)
        if state is None:
            state = self._states[replica.name] = ReplicaStats()
            if tier is not None:
                _settle(state, tier)
        return state

    def configure(self, routes: RoutesConfig) -> None:
        """A new config version: every replica takes its tier's settings (the learned statistics stay)."""
        for tier in routes.tiers:
            for replica in tier.replicas:
                _settle(self.state(replica), tier)

    def states(self) -> dict[str, ReplicaStats]:
        return self._states

    def predict(self, tier: Tier, replica: Replica, tokens: int, cached_tokens: int = 0) -> float:
        state = self.state(replica, tier)
        prior = None if state.tried else self._prior(tier)
        return state.predict_ttft(tokens, cached_tokens, prior)

    def _prior(self, tier: Tier) -> float | None:
        """The fixed TTFT overhead of a replica not tried yet: its tier's mean (None: nothing seen)."""
        return _mean_overhead([self.state(r, tier) for r in tier.replicas])

    def next_pick(self) -> int:
        """The next pick's number (a lease's `last_pick`: exact ties go to the least recently picked)."""
        return next(self._picks)

    def rank(self, tier: Tier, tokens: int, balancing: Balancing, now: float | None = None) -> tuple[Replica, ...]:
        """The tier's replicas ranked (`ranking`, without saying which one exploration put first)."""
        return self.ranking(tier, tokens, balancing, now)[0]

    def ranking(self, tier: Tier, tokens: int, balancing: Balancing, now: float | None = None, *,
                keep: Replica | None = None, dry: bool = False) -> tuple[tuple[Replica, ...], Replica | None]:
        """The tier's available replicas, best first: lowest predicted TTFT for a prompt of `tokens`;
        among near-ties (within `near_tie` of the best, or within the best one's own TTFT noise: a
        difference its measurements cannot tell apart), the less loaded of two drawn at random (`near_tie` 0: no draw; exact ties go
        to the least recently picked). Open circuits and replicas failing their health checks are left
        out (empty: none may be tried now). Exploration: a replica not sent a request for
        `explore_after_s` while others of its tier were is put first, once per such interval, so
        predictions learned long ago (one bad sample) cannot keep it idle. Also returned: the replica exploration
        put first (None: none). `keep`: the one a ranking of the same request explored: first again while it
        may be tried (exploration is not lost to a second ranking, nor spent twice). `dry`: nothing marked
        (`route explain`)."""
        if balancing.strategy == "round_robin":
            return self._rotation(tier, dry), None
        ranked = self._by_prediction(tier, tokens, balancing)
        if balancing.explore_after_s <= 0 or len(ranked) < 2:
            return ranked, None
        if keep is not None and keep in ranked:
            stale: Replica | None = keep
        else:
            now = time.monotonic() if now is None else now
            stale = self._passed_over(tier, ranked, balancing.explore_after_s, now, dry)
        return (ranked, None) if stale is None else ((stale, *(r for r in ranked if r is not stale)), stale)

    def _passed_over(self, tier: Tier, ranked: tuple[Replica, ...], explore_after_s: float,
                     now: float, dry: bool = False) -> Replica | None:
        """The replica of `ranked` passed over longest, when that is `explore_after_s` or more while another
        was picked within it (marked as probed: not again before another interval)."""
        states = [self.state(r, tier) for r in ranked]
        latest = max(s.picked_at for s in states)
        if now - latest >= explore_after_s:
            return None  # the tier was idle: nobody was passed over
        since, i = min((max(s.picked_at, s.probed_at), i) for i, s in enumerate(states))
        if now - since < explore_after_s:
            return None
        if not dry:
            states[i].probed_at = now
        return ranked[i]

    def _by_prediction(self, tier: Tier, tokens: int, balancing: Balancing) -> tuple[Replica, ...]:
        states = [self.state(r, tier) for r in tier.replicas]
        prior = None if all(s.tried for s in states) else _mean_overhead(states)
        # (predicted TTFT, in flight, last pick, position, replica): exact ties keep the tier's order
        scored: list[tuple[float, int, int, int, Replica]] = []
        for i, (replica, state) in enumerate(zip(tier.replicas, states)):
            if state.available():
                scored.append((state.predict_ttft(tokens, 0, prior), state.in_flight, state.last_pick, i, replica))
        scored.sort()
        ranked = tuple([entry[-1] for entry in scored])
        if len(scored) < 2 or balancing.near_tie == 0:
            return ranked
        noise = states[scored[0][3]].ttft_dev_s or 0.0  # closer than the best one's own TTFT noise: a tie too
        cutoff = scored[0][0] * (1 + balancing.near_tie) + max(NEAR_TIE_FLOOR_S, noise)
        near = [entry for entry in scored if entry[0] <= cutoff]
        if len(near) < 2:
            return ranked
        one, other = self._random.sample(near, 2)
        # the less loaded of the two: fewer in flight, then picked longer ago (a full tie: the first drawn)
        first = (other if (other[1], other[2]) < (one[1], one[2]) else one)[-1]
        return (first, *(r for r in ranked if r is not first))

    def _rotation(self, tier: Tier, dry: bool = False) -> tuple[Replica, ...]:
        """The available replicas, starting one further along at each call (`dry`: where the next call starts,
        without moving on)."""
        available = [r for r in tier.replicas if self.state(r, tier).available()]
        if not available:
            return ()
        start = self._turn % len(available)
        if not dry:
            self._turn += 1
        return tuple(available[start:] + available[:start])

    def has_available(self, tier: Tier) -> bool:
        """Some replica of the tier may be tried now (healthy, circuit not open)."""
        return any(self.state(r, tier).available() for r in tier.replicas)

    def capacity(self, tier: Tier) -> int | None:
        """Requests the tier's replicas run at once, when its replicas' batch slots are known."""
        return None if tier.slots_per_replica is None else tier.slots_per_replica * len(tier.replicas)

    def retry_in(self, tier: Tier, health_interval_s: float = 0.0) -> float:
        """Seconds until some replica of the tier may be tried again (for Retry-After): the soonest end of a
        circuit's cooldown or, for replicas failing their health checks, of the next check."""
        now = time.monotonic()
        return min((self.state(r, tier).retry_in(health_interval_s, now) for r in tier.replicas), default=0.0)


def _mean_overhead(states: list[ReplicaStats]) -> float | None:
    known = [o for s in states if (o := s.overhead_s) is not None]
    return sum(known) / len(known) if known else None


def _settle(state: ReplicaStats, tier: Tier) -> None:
    state.prefill_tps = tier.prefill_tokens_per_s or DEFAULT_PREFILL_TPS
    state.slots = tier.slots_per_replica


class Lease:
    """One attempt's hold on a replica: counts it in flight, learns its TTFT at the first byte and
    its TPOT/E2E (or failure) at release. Releasing twice is a no-op. `tokens` is the prompt's
    estimated length, `cached` the part of it warm in the replica's prefix cache."""

    __slots__ = ("replica", "_balancing", "_state", "_own_tokens", "_work", "_queue_s", "_sent_at", "_first_at",
                 "_estimated_at", "_held", "_predicted_s")

    def __init__(self, pool: ReplicaPool, replica: Replica, tier: Tier, tokens: int, cached: int,
                 balancing: Balancing, predicted_s: float | None = None) -> None:
        """`predicted_s`: the replica's TTFT for this prompt as just predicted from the same state (None: predict)."""
        self.replica = replica
        self._balancing = balancing
        state = self._state = pool.state(replica, tier)
        # what ranking expected of it (calibration)
        self._predicted_s = pool.predict(tier, replica, tokens, cached) if predicted_s is None else predicted_s
        self._work = state.work(tokens, cached)
        self._queue_s = state.queue_s()
        self._own_tokens = max(0, tokens - cached)
        self._sent_at = time.perf_counter()
        self._first_at: float | None = None
        self._estimated_at: float | None = None
        self._held = True
        state.in_flight += 1
        state.pending_tokens += self._own_tokens
        state.sent_tokens += self._own_tokens
        state.pending += 1
        state.sent += 1
        state.last_pick = pool.next_pick()
        state.picked_at = time.monotonic()
        state.breaker.on_send()

    @property
    def first_at(self) -> float | None:
        """When the first token came: seen (a stream), told by the server, or else estimated."""
        return self._estimated_at if self._first_at is None else self._first_at

    def first_byte(self, at: float | None = None) -> None:
        """The replica started answering: its TTFT is a sample, its prompt no longer waits."""
        if self._first_at is not None or not self._held:
            return
        self._first_at = time.perf_counter() if at is None else at
        self._state.pending_tokens -= self._own_tokens
        self._state.pending -= 1
        settings = self._balancing
        self._state.observe_ttft(self._first_at - self._sent_at, self._work, self._queue_s, settings.ewma_alpha,
                                 settings.explore_after_s, predicted_s=self._predicted_s)

    def release(self, failed: bool = False, completion: int = 0, decode_s: float | None = None) -> None:
        """The attempt ended (`failed`: the replica's fault), after `completion` output tokens. A non-streamed
        answer's first token came `decode_s` before its end when the server says so (`server_decode_s`):
        a TTFT sample; else its time is only estimated (`first_at`), and teaches neither TTFT nor TPOT."""
        if not self._held:
            return
        now = time.perf_counter()
        if self._first_at is None and not failed:
            if decode_s is not None:
                self.first_byte(max(self._sent_at, now - decode_s))
            else:
                self._estimated_at = self._estimated_first_byte(now, completion)
        self._held = False
        state, settings = self._state, self._balancing
        state.in_flight -= 1
        if self._first_at is None:
            state.pending_tokens -= self._own_tokens
            state.pending -= 1
        if failed:
            state.breaker.on_failure(settings.breaker)
        else:
            state.breaker.on_success()
        tpot = None
        if self._first_at is not None and completion > 1:
            tpot = (now - self._first_at) / (completion - 1)
        state.observe_finish(now - self._sent_at, tpot, failed, settings.ewma_alpha)

    def _estimated_first_byte(self, now: float, completion: int) -> float:
        """A non-streamed answer has no first byte: its end minus the output at the usual TPOT (for the
        stages waiting for a first byte, such as the admission limiter; not a TTFT sample)."""
        decode = (completion - 1) * (self._state.tpot_s or 0.0) if completion > 1 else 0.0
        return max(self._sent_at, now - decode)
