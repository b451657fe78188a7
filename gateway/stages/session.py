"""Session: after route, a conversation keeps the tier its turns were routed to, moving only up (issue 32).

For model 'auto' under a tenant policy with `sessions` (a TTL), each turn records its routed tier in the
`SessionStore` and is served by the tier the session holds: the highest any of its turns was routed to,
among the chat tiers, in routes order (cheapest first). A turn that needs a larger tier upgrades the
session; a turn that would do with a smaller one stays on the session's tier (`ctx.session_route` "held").
The route stage's choice stays what the classifier saw; the session only raises it. A tier the tenant may
no longer use, or too small for the request's `max_tokens`, is not held (the turn's own tier serves).
Said in the `x-gateway-session` response header, the log line (`session`, `session_route`) and `route explain`.
"""

from __future__ import annotations

from typing import Any

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig, Tier
from gateway.context import RequestContext
from gateway.routing.sessions import Held, SessionStore, session_id
from gateway.types import AUTO_MODEL, Reply


class SessionStage:
    def __init__(self, store: SessionStore | None, pool: ReplicaPool) -> None:
        self._store = store
        self._pool = pool
        self._ranks: tuple[GatewayConfig | None, dict[str, int]] = (None, {})

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        tenant, tier = ctx.tenant, ctx.tier
        rule = tenant.sessions if tenant is not None else None
        if rule is None or tier is None or self._store is None or ctx.model_requested != AUTO_MODEL \
                or tier.endpoint != "chat":
            return None
        assert tenant is not None
        key = session_id(tenant.name, ctx.session_header, ctx.body)
        if key is None:
            return None
        ranks = self._ranks_of(ctx.config)
        routed = Held(ranks[tier.name], tier.name)
        held, before = await self._store.hold(key, routed, rule.ttl_s)
        ctx.session = key
        target = ctx.config.tiers.get(held.tier)
        if held.tier == tier.name or target is None or not _may_serve(ctx, target):
            ctx.session_route = "new" if before is None else "upgraded" if routed.rank > before.rank else "kept"
            return None
        ctx.session_route = "held"
        ctx.session_from = tier.name
        ctx.tier = target
        ctx.candidates = self._pool.rank(target, ctx.prompt_tokens_est, ctx.config.routes.balancing)
        return None

    async def explain(self, ctx: RequestContext, header: str | None) -> dict[str, Any] | None:
        """What the session would do to this turn, for `route explain` (nothing recorded; `header`: the
        x-session-id to look up). None when sessions do not apply to the request."""
        tenant, tier = ctx.tenant, ctx.tier
        rule = tenant.sessions if tenant is not None else None
        if rule is None or tier is None or ctx.model_requested != AUTO_MODEL or tier.endpoint != "chat":
            return None
        assert tenant is not None
        key = session_id(tenant.name, header, ctx.body)
        if key is None:
            return {"id": None, "holds": None, "ttl_s": rule.ttl_s, "effect": "none (no conversation to key on)"}
        if self._store is None:
            return {"id": key, "holds": None, "ttl_s": rule.ttl_s,
                    "effect": "not checked (no session store: give gateway route explain --redis URL)"}
        held = await self._store.peek(key)
        target = ctx.config.tiers.get(held.tier) if held is not None else None
        ranks = self._ranks_of(ctx.config)
        if held is None or target is None:
            effect = "new session: its tier would be the routed one"
        elif ranks[tier.name] >= ranks.get(held.tier, -1):
            effect = "the routed tier would serve (an upgrade)" if held.tier != tier.name else "kept"
        elif _may_serve(ctx, target):
            effect = f"held: the session's tier {held.tier} would serve, not the routed {tier.name}"
        else:
            effect = f"the session's tier {held.tier} may not serve this request: the routed one would"
        return {"id": key, "holds": held.tier if held is not None else None, "ttl_s": rule.ttl_s, "effect": effect}

    def _ranks_of(self, config: GatewayConfig) -> dict[str, int]:
        """Each tier's place in routes (cheapest first), computed once per config version."""
        known, ranks = self._ranks
        if known is not config:
            ranks = {t.name: i for i, t in enumerate(config.routes.tiers)}
            self._ranks = (config, ranks)
        return ranks


def _may_serve(ctx: RequestContext, tier: Tier) -> bool:
    """Whether the session's tier may serve this turn: the tenant may use it, it serves chat, and it fits."""
    if ctx.tenant is not None and not ctx.tenant.allows(tier.name):
        return False
    if tier.endpoint != "chat":
        return False
    return ctx.max_tokens is None or ctx.max_tokens <= tier.context_window
