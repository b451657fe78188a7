"""Affinity: which replica of the tier last served the prompt's longest prefix (a warm KV cache).

Shared through Redis, so every gateway replica agrees. This step only looks the prefix up (`ctx.prefix_*`);
the ranking step (gateway.routing.ranking) then puts the affine replica first unless its prediction exceeds the
best replica's by more than `balancing.affinity_margin` times and `affinity_slack_ms` (SGLang's gateway switches
at 1.5x). A step after the cache: a cache hit needs no replica, so it pays no prefix lookup. Prefixes are kept
per tenant scope (gateway.keyspace): a tenant follows only its own prompts' prefixes (or those of tenants its
policy shares the cache with). After a good answer, the replica that gave it holds the prefix (`remember`).
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.backends.stats import estimate_tokens
from gateway.cache.background import BackgroundWrites
from gateway.cache.prefix import PrefixStore
from gateway.config import GatewayConfig, Tier
from gateway.context import RequestContext
from gateway.keyspace import tenant_scope
from gateway.types import Reply


class Warm(NamedTuple):
    """The replica holding a prompt's prefix: its name, the prefix's blocks and its tokens."""

    replica: str
    blocks: int
    tokens: int


class AffinityStage:
    def __init__(self, store: PrefixStore | None = None, writes: BackgroundWrites | None = None) -> None:
        self._store = store  # None: no Redis, no affinity (the ranking alone decides)
        self._writes = writes

    def idle(self, config: GatewayConfig) -> bool:
        """No prefix store (no Redis): the step does nothing, whatever the config."""
        return self._store is None

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        if self._store is None or ctx.route.tier is None:
            return None
        await self.dry(ctx)
        ctx.finishers.append(self.remember)
        return None

    async def dry(self, ctx: RequestContext) -> None:
        """The lookup alone (it records nothing)."""
        if ctx.route.tier is None:
            return
        warm = await self.lookup(ctx, ctx.route.tier)
        if warm is not None:
            ctx.route.prefix_replica, ctx.route.prefix_blocks, ctx.route.prefix_tokens = warm

    async def lookup(self, ctx: RequestContext, tier: Tier) -> Warm | None:
        """The replica of `tier` holding the prompt's longest prefix (None: none known, or no Redis)."""
        if self._store is None or len(tier.replicas) < 2:
            return None
        match = await self._store.lookup(tier.name, _scope(ctx), ctx.prompt_text())
        if match is None:
            return None
        warm_tokens = min(ctx.prompt_tokens_est, estimate_tokens(match.blocks * self._store.block_chars))
        return Warm(match.replica, match.blocks, warm_tokens)

    def remember(self, ctx: RequestContext) -> None:
        """After a good answer: this replica now holds the prompt's prefix."""
        if self._store is None or self._writes is None:
            return
        if ctx.result.outcome == "ok" and ctx.upstream.upstream_started and ctx.route.tier and ctx.upstream.replica and len(ctx.route.tier.replicas) > 1:
            self._writes.spawn(self._store.record(ctx.route.tier.name, _scope(ctx), ctx.prompt_text(), ctx.upstream.replica.name))


def _scope(ctx: RequestContext) -> str:
    """The request's tenant scope (requests reach this stage authenticated; the anonymous tenant is one too)."""
    return tenant_scope(ctx.tenant) if ctx.tenant is not None else ctx.tenant_name
