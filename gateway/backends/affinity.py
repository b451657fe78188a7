"""Prefix affinity: send a prompt to the replica that last served its longest prefix (warm KV cache).

Shared through Redis, so every gateway replica agrees. The affine replica goes first (its predicted
TTFT counts the warm prefix) unless that prediction exceeds the best replica's by more than
`balancing.affinity_margin` times and `affinity_slack_ms` (SGLang's gateway switches at 1.5x).
A stage after the cache: a cache hit needs no replica, so it pays no prefix lookup.
"""

from __future__ import annotations

from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.cache.background import BackgroundWrites
from gateway.cache.prefix import PrefixStore
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.types import Reply


class Affinity:
    def __init__(self, store: PrefixStore, writes: BackgroundWrites, pool: ReplicaPool) -> None:
        self._store = store
        self._writes = writes
        self._pool = pool

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
        ctx.prefix_blocks, ctx.prefix_replica = match.blocks, affine.name
        ctx.prefix_tokens = min(ctx.prompt_tokens_est, estimate_tokens(match.blocks * self._store.block_chars))
        if affine is ranked[0]:
            return ranked
        tier, tokens, balancing = ctx.tier, ctx.prompt_tokens_est, ctx.config.routes.balancing
        best = self._pool.predict(tier, ranked[0], tokens)
        warm = self._pool.predict(tier, affine, tokens, ctx.prefix_tokens)
        if warm > best * balancing.affinity_margin and warm - best > balancing.affinity_slack_ms / 1000:
            return ranked
        return (affine, *(r for r in ranked if r is not affine))

    def remember(self, ctx: RequestContext) -> None:
        """After a good answer: this replica now holds the prompt's prefix."""
        if ctx.outcome == "ok" and ctx.upstream_started and ctx.tier and ctx.replica and len(ctx.tier.replicas) > 1:
            self._writes.spawn(self._store.record(ctx.tier.name, ctx.prompt_text(), ctx.replica.name))
