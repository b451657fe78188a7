"""Replica choice inside a tier: the lowest predicted time to first token, power of two choices
among near-ties, and the bookkeeping (`Lease`) that keeps each replica's live statistics."""

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
        self._turns = itertools.count()
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

    def rank(self, tier: Tier, tokens: int, balancing: Balancing) -> tuple[Replica, ...]:
        """The tier's available replicas, best first: lowest predicted TTFT for a prompt of `tokens`;
        among near-ties, the less loaded of two drawn at random (`near_tie` 0: no draw; exact ties go
        to the least recently picked). Open circuits and replicas failing their health checks are left
        out (empty: none may be tried now)."""
        if balancing.strategy == "round_robin":
            return self._rotation(tier)
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
        cutoff = scored[0][0] * (1 + balancing.near_tie) + NEAR_TIE_FLOOR_S
        near = [entry for entry in scored if entry[0] <= cutoff]
        if len(near) < 2:
            return ranked
        one, other = self._random.sample(near, 2)
        # the less loaded of the two: fewer in flight, then picked longer ago (a full tie: the first drawn)
        first = (other if (other[1], other[2]) < (one[1], one[2]) else one)[-1]
        return (first, *(r for r in ranked if r is not first))

    def _rotation(self, tier: Tier) -> tuple[Replica, ...]:
        """The available replicas, starting one further along at each call."""
        available = [r for r in tier.replicas if self.state(r, tier).available()]
        if not available:
            return ()
        start = next(self._turns) % len(available)
        return tuple(available[start:] + available[:start])

    def has_available(self, tier: Tier) -> bool:
        """Some replica of the tier may be tried now (healthy, circuit not open)."""
        return any(self.state(r, tier).available() for r in tier.replicas)

    def capacity(self, tier: Tier) -> int | None:
        """Requests the tier's replicas run at once, when its replicas' batch slots are known."""
        return None if tier.slots_per_replica is None else tier.slots_per_replica * len(tier.replicas)

    def retry_in(self, tier: Tier) -> float:
        """Seconds until some replica of the tier may be tried again (for Retry-After)."""
        return min((self.state(r, tier).breaker.retry_in() for r in tier.replicas), default=0.0)


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
                 "_held")

    def __init__(self, pool: ReplicaPool, replica: Replica, tier: Tier, tokens: int, cached: int,
                 balancing: Balancing) -> None:
        self.replica = replica
        self._balancing = balancing
        state = self._state = pool.state(replica, tier)
        self._work = state.work(tokens, cached)
        self._queue_s = state.queue_s()
        self._own_tokens = max(0, tokens - cached)
        self._sent_at = time.perf_counter()
        self._first_at: float | None = None
        self._held = True
        state.in_flight += 1
        state.pending_tokens += self._own_tokens
        state.last_pick = next(pool._picks)
        state.breaker.on_send()

    @property
    def first_at(self) -> float | None:
        return self._first_at

    def first_byte(self, at: float | None = None) -> None:
        """The replica started answering: its TTFT is a sample, its prompt no longer waits."""
        if self._first_at is not None or not self._held:
            return
        self._first_at = time.perf_counter() if at is None else at
        self._state.pending_tokens -= self._own_tokens
        self._state.observe_ttft(self._first_at - self._sent_at, self._work, self._queue_s, self._balancing.ewma_alpha)

    def release(self, failed: bool = False, completion: int = 0) -> None:
        """The attempt ended (`failed`: the replica's fault), after `completion` output tokens."""
        if not self._held:
            return
        now = time.perf_counter()
        if self._first_at is None and not failed:
            self.first_byte(self._estimated_first_byte(now, completion))
        self._held = False
        state, settings = self._state, self._balancing
        state.in_flight -= 1
        if self._first_at is None:
            state.pending_tokens -= self._own_tokens
        if failed:
            state.breaker.on_failure(settings.breaker)
        else:
            state.breaker.on_success()
        tpot = None
        if self._first_at is not None and completion > 1:
            tpot = (now - self._first_at) / (completion - 1)
        state.observe_finish(now - self._sent_at, tpot, failed, settings.ewma_alpha)

    def _estimated_first_byte(self, now: float, completion: int) -> float:
        """A non-streamed answer has no first byte: its end minus the output at the usual TPOT."""
        decode = (completion - 1) * (self._state.tpot_s or 0.0) if completion > 1 else 0.0
        return max(self._sent_at, now - decode)
