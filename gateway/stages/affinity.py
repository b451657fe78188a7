"""Affinity: the replica choice inside the tier. The route stage ranked the tier's replicas by predicted
TTFT; this stage puts the replica that last served the prompt's longest prefix (a warm KV cache) first.

Shared through Redis, so every gateway replica agrees. The affine replica goes first (its predicted
TTFT counts the warm prefix) unless that prediction exceeds the best replica's by more than
`balancing.affinity_margin` times and `affinity_slack_ms` (SGLang's gateway switches at 1.5x).
A stage after the cache: a cache hit needs no replica, so it pays no prefix lookup. Prefixes are kept per
tenant scope (gateway.keyspace): a tenant follows only its own prompts' prefixes (or those of tenants its
policy shares the cache with). `choose` is the
one routing choice (rank, then affinity) admission also makes after a queue wait and for brownout.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.cache.background import BackgroundWrites
from gateway.cache.prefix import PrefixStore
from gateway.config import Replica, Tier
from gateway.context import RequestContext
from gateway.keyspace import tenant_scope
from gateway.types import Reply


class Choice(NamedTuple):
    """A tier's replicas for one request, best first, and the warm prefix the first may hold (a named
    tuple: immutable, and made on every request at a fraction of a frozen dataclass's cost)."""

    replicas: tuple[Replica, ...]
    prefix_replica: str | None = None
    prefix_blocks: int = 0
    prefix_tokens: int = 0

    def apply(self, ctx: RequestContext) -> None:
        ctx.candidates = self.replicas
        ctx.prefix_replica, ctx.prefix_blocks, ctx.prefix_tokens = (
            self.prefix_replica, self.prefix_blocks, self.prefix_tokens)


class AffinityStage:
    def __init__(self, pool: ReplicaPool, store: PrefixStore | None = None,
                 writes: BackgroundWrites | None = None) -> None:
        self._pool = pool
        self._store = store  # None: no Redis, no affinity (the ranking alone decides)
        self._writes = writes

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        if self._store is None or ctx.tier is None:
            return None
        (await self.prefer(ctx, ctx.tier, ctx.candidates)).apply(ctx)
        ctx.finishers.append(self.remember)
        return None

    async def choose(self, ctx: RequestContext, tier: Tier) -> Choice:
        """The tier's replicas ranked for this request now, with the affine one first when worth it."""
        ranked = self._pool.rank(tier, ctx.prompt_tokens_est, ctx.config.routes.balancing)
        return await self.prefer(ctx, tier, ranked)

    async def prefer(self, ctx: RequestContext, tier: Tier, ranked: tuple[Replica, ...]) -> Choice:
        """`ranked` with the affine replica first, when there is one worth following."""
        if len(ranked) < 2 or self._store is None:
            return Choice(ranked)
        match = await self._store.lookup(tier.name, _scope(ctx), ctx.prompt_text())
        affine = None if match is None else next((r for r in ranked if r.name == match.replica), None)
        if match is None or affine is None:
            return Choice(ranked)
        tokens = ctx.prompt_tokens_est
        warm_tokens = min(tokens, estimate_tokens(match.blocks * self._store.block_chars))
        choice = Choice(ranked, affine.name, match.blocks, warm_tokens)
        if affine is ranked[0]:
            return choice
        balancing = ctx.config.routes.balancing
        best = self._pool.predict(tier, ranked[0], tokens)
        warm = self._pool.predict(tier, affine, tokens, warm_tokens)
        if warm > best * balancing.affinity_margin and warm - best > balancing.affinity_slack_ms / 1000:
            return choice
        return Choice((affine, *(r for r in ranked if r is not affine)), affine.name, match.blocks, warm_tokens)

    def remember(self, ctx: RequestContext) -> None:
        """After a good answer: this replica now holds the prompt's prefix."""
        if self._store is None or self._writes is None:
            return
        if ctx.outcome == "ok" and ctx.upstream_started and ctx.tier and ctx.replica and len(ctx.tier.replicas) > 1:
            self._writes.spawn(self._store.record(ctx.tier.name, _scope(ctx), ctx.prompt_text(), ctx.replica.name))


def _scope(ctx: RequestContext) -> str:
    """The request's tenant scope (requests reach this stage authenticated; the anonymous tenant is one too)."""
    return tenant_scope(ctx.tenant) if ctx.tenant is not None else ctx.tenant_name
