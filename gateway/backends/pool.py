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
        return self.state(replica, tier).predict_ttft(tokens, cached_tokens, self._prior(tier))

    def _prior(self, tier: Tier) -> float | None:
        """The fixed TTFT overhead of a replica not tried yet: its tier's mean (None: nothing seen)."""
        known = [o for r in tier.replicas if (o := self.state(r, tier).overhead_s) is not None]
        return sum(known) / len(known) if known else None

    def rank(self, tier: Tier, tokens: int, balancing: Balancing) -> tuple[Replica, ...]:
        """The tier's available replicas, best first: lowest predicted TTFT for a prompt of `tokens`;
        among near-ties, the less loaded of two drawn at random (`near_tie` 0: no draw; exact ties go
        to the least recently picked). Open circuits and replicas failing their health checks are left
        out (empty: none may be tried now)."""
        if balancing.strategy == "round_robin":
            return self._rotation(tier)
        prior = self._prior(tier)
        scored = sorted(
            ((self.state(r, tier).predict_ttft(tokens, 0, prior), r) for r in tier.replicas
             if self.state(r, tier).available()),
            key=lambda pair: (pair[0], self.state(pair[1]).in_flight, self.state(pair[1]).last_pick),
        )
        if len(scored) < 2 or balancing.near_tie == 0:
            return tuple(r for _, r in scored)
        cutoff = scored[0][0] * (1 + balancing.near_tie) + NEAR_TIE_FLOOR_S
        near = [r for predicted, r in scored if predicted <= cutoff]
        if len(near) < 2:
            return tuple(r for _, r in scored)
        drawn = self._random.sample(near, 2)
        first = min(drawn, key=lambda r: (self.state(r).in_flight, self.state(r).last_pick))
        return (first, *(r for _, r in scored if r is not first))

    def _rotation(self, tier: Tier) -> tuple[Replica, ...]:
        """The available replicas, starting one further along at each call."""
        available = [r for r in tier.replicas if self.state(r, tier).available()]
        if not available:
            return ()
        start = next(self._turns) % len(available)
        return tuple(available[start:] + available[:start])

    def capacity(self, tier: Tier) -> int | None:
        """Requests the tier's replicas run at once, when its replicas' batch slots are known."""
        return None if tier.slots_per_replica is None else tier.slots_per_replica * len(tier.replicas)

    def retry_in(self, tier: Tier) -> float:
        """Seconds until some replica of the tier may be tried again (for Retry-After)."""
        return min((self.state(r, tier).breaker.retry_in() for r in tier.replicas), default=0.0)


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
