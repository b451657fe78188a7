"""Live bookkeeping per replica: requests in flight and recent failures."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gateway.config import Replica, Tier


@dataclass(slots=True)
class ReplicaState:
    in_flight: int = 0
    failures: int = 0
    last_pick: int = 0


class ReplicaPool:
    """Ranks a tier's replicas for a new request: fewest in flight first, then least recently picked."""

    def __init__(self) -> None:
        self._states: dict[str, ReplicaState] = {}
        self._picks = itertools.count(1)

    def state(self, replica: Replica) -> ReplicaState:
        state = self._states.get(replica.name)
        if state is None:
            state = self._states[replica.name] = ReplicaState()
        return state

    def rank(self, tier: Tier) -> tuple[Replica, ...]:
        if len(tier.replicas) == 1:
            return tier.replicas
        return tuple(sorted(tier.replicas, key=lambda r: (self.state(r).in_flight, self.state(r).last_pick)))

    def acquire(self, replica: Replica) -> None:
        state = self.state(replica)
        state.in_flight += 1
        state.last_pick = next(self._picks)

    def release(self, replica: Replica, *, failed: bool = False) -> None:
        state = self.state(replica)
        state.in_flight -= 1
        if failed:
            state.failures += 1


class Lease:
    """One request's hold on a replica; releasing twice is a no-op."""

    __slots__ = ("_pool", "replica", "_held")

    def __init__(self, pool: ReplicaPool, replica: Replica) -> None:
        self._pool = pool
        self.replica = replica
        self._held = True
        pool.acquire(replica)

    def release(self, failed: bool = False) -> None:
        if self._held:
            self._held = False
            self._pool.release(self.replica, failed=failed)
