"""Ranking: the tier's replicas for this request, best first, decided once (the last routing step).

The pool ranks the available replicas by predicted TTFT (power of two choices among near-ties; a replica passed
over for `explore_after_s` put first, once per interval: gateway.backends.pool). Then, unless exploration put a
replica first, the replica holding the prompt's prefix (the affinity step's lookup) goes first when its warm
prediction is not much slower than the best one's (`affinity_margin` times and `affinity_slack_ms` over it).

`choose` is that choice as admission makes it again after a queue wait (the same tier: the replica exploration
chose stays first) and for brownout (another tier: its own lookup). `dry` ranks without marking exploration.
"""

from __future__ import annotations

from typing import NamedTuple

from gateway.backends.pool import ReplicaPool
from gateway.config import Replica, Tier
from gateway.config.routes import Balancing
from gateway.context import RequestContext
from gateway.routing.affinity import AffinityStage, Warm
from gateway.types import Reply


class Choice(NamedTuple):
    """A tier's replicas for one request, best first, and the warm prefix the first may hold (a named
    tuple: immutable, and made on every request at a fraction of a frozen dataclass's cost)."""

    replicas: tuple[Replica, ...]
    prefix_replica: str | None = None
    prefix_blocks: int = 0
    prefix_tokens: int = 0
    explored: Replica | None = None  # the replica exploration put first

    def apply(self, ctx: RequestContext) -> None:
        ctx.route.candidates = self.replicas
        ctx.route.prefix_replica, ctx.route.prefix_blocks, ctx.route.prefix_tokens = (
            self.prefix_replica, self.prefix_blocks, self.prefix_tokens)
        ctx.route.explored = self.explored


def ranked(pool: ReplicaPool, tier: Tier, tokens: int, balancing: Balancing, warm: Warm | None,
           keep: Replica | None = None, dry: bool = False) -> Choice:
    """The choice over the pool's state: its ranking, then the affine replica first when worth it."""
    replicas, explored = pool.ranking(tier, tokens, balancing, keep=keep, dry=dry)
    affine = None if warm is None else next((r for r in replicas if r.name == warm.replica), None)
    if warm is None or affine is None:
        return Choice(replicas, explored=explored)
    choice = Choice(replicas, affine.name, warm.blocks, warm.tokens, explored)
    if affine is replicas[0] or explored is not None:
        return choice  # exploration's pick is not lost to the prefix
    best = pool.predict(tier, replicas[0], tokens)
    hot = pool.predict(tier, affine, tokens, warm.tokens)
    if hot > best * balancing.affinity_margin and hot - best > balancing.affinity_slack_ms / 1000:
        return choice
    return choice._replace(replicas=(affine, *(r for r in replicas if r is not affine)))


class RankStage:
    def __init__(self, pool: ReplicaPool, affinity: AffinityStage | None = None) -> None:
        self._pool = pool
        self._affinity = affinity or AffinityStage()

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        if ctx.route.tier is not None:
            self._here(ctx, ctx.route.tier, dry=False).apply(ctx)
        return None

    async def dry(self, ctx: RequestContext) -> None:
        if ctx.route.tier is not None:
            self._here(ctx, ctx.route.tier, dry=True).apply(ctx)

    async def choose(self, ctx: RequestContext, tier: Tier) -> Choice:
        """The replicas of `tier` ranked for this request now: again on its tier (after a queue wait: the prefix
        looked up before, the replica exploration chose kept first), or on another (its own lookup)."""
        if tier is ctx.route.tier:
            return self._here(ctx, tier, dry=False)
        warm = await self._affinity.lookup(ctx, tier)
        return ranked(self._pool, tier, ctx.prompt_tokens_est, ctx.config.routes.balancing, warm)

    def _here(self, ctx: RequestContext, tier: Tier, dry: bool) -> Choice:
        warm = None if ctx.route.prefix_replica is None else Warm(ctx.route.prefix_replica, ctx.route.prefix_blocks, ctx.route.prefix_tokens)
        return ranked(self._pool, tier, ctx.prompt_tokens_est, ctx.config.routes.balancing, warm, ctx.route.explored, dry)
