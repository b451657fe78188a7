"""Prefix affinity: send a prompt to the replica that last served its longest prefix (warm KV cache).

Shared through Redis, so every gateway replica agrees. The affine replica goes first unless it has
`slack` more requests in flight than the least loaded one (the latency-aware choice refines this).
A stage after the cache: a cache hit needs no replica, so it pays no prefix lookup.
"""

from __future__ import annotations

from gateway.backends.pool import ReplicaPool
from gateway.cache.background import BackgroundWrites
from gateway.cache.prefix import PrefixStore
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.types import Reply


class Affinity:
    def __init__(self, store: PrefixStore, writes: BackgroundWrites, pool: ReplicaPool, slack: int = 2) -> None:
        self._store = store
        self._writes = writes
        self._pool = pool
        self._slack = slack

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        ctx.candidates = await self.prefer(ctx, ctx.candidates)
        ctx.finishers.append(self.remember)
        return None

    async def prefer(self, ctx: RequestContext, ranked: tuple[Replica, ...]) -> tuple[Replica, ...]:
        """`ranked` with the affine replica first, when there is one worth following."""
        if len(ranked) < 2 or ctx.tier is None:
            return ranked
        match = await self._store.lookup(ctx.tier.name, ctx.prompt_text())
        if match is None:
            return ranked
        affine = next((r for r in ranked if r.name == match.replica), None)
        if affine is None:
            return ranked
        ctx.prefix_blocks = match.blocks
        least = self._pool.state(ranked[0]).in_flight
        if self._pool.state(affine).in_flight > least + self._slack:
            return ranked
        return (affine, *(r for r in ranked if r is not affine))

    def remember(self, ctx: RequestContext) -> None:
        """After a good answer: this replica now holds the prompt's prefix."""
        if ctx.outcome == "ok" and ctx.upstream_started and ctx.tier and ctx.replica and len(ctx.tier.replicas) > 1:
            self._writes.spawn(self._store.record(ctx.tier.name, ctx.prompt_text(), ctx.replica.name))
