"""Detour: model 'auto' routed to a tier with no healthy replica goes to the nearest healthy tier instead.

Chat tiers only (an embedding tier's vectors are not another's). A tier is down when none of its replicas may be
tried (every one failing its health checks or with an open circuit). The detour looks at the tiers the tenant
may use that serve the same endpoint and fit the request's `max_tokens`, in the order the routes file lists them
(the portfolio's order, smaller and cheaper first): the nearest one after the tier first (up: at least as
capable), then the nearest one before it (down). A tenant whose policy sets `detour: false` gets the 503
instead. The request then carries `rerouted_from` (the down tier): the `x-gateway-rerouted-from` response
header and the request log line's `rerouted_from` say it.

`nearest_healthy` is the decision, a pure function with an injected health check; `DetourStage` is the step of
the request path over the pool's health (it records nothing: its dry run is itself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.context import RequestContext
from gateway.types import AUTO_MODEL, Reply

log = structlog.get_logger("gateway.route")


def nearest_healthy(tiers: Sequence[Tier], down: Tier, tenant: TenantPolicy | None, max_tokens: int | None,
                    healthy: Callable[[Tier], bool]) -> Tier | None:
    """The tier to serve a request routed to `down` instead: up first, then down; None when none is healthy."""
    position = next((i for i, tier in enumerate(tiers) if tier.name == down.name), None)
    if position is None:
        return None
    above, below = list(tiers[position + 1:]), list(reversed(tiers[:position]))
    for tier in above + below:
        if (tier.endpoint == down.endpoint and (tenant is None or tenant.allows(tier.name))
                and (max_tokens is None or max_tokens <= tier.context_window) and healthy(tier)):
            return tier
    return None


class DetourStage:
    """'auto' on a chat tier none of whose replicas may be tried: the nearest healthy tier, when the tenant's
    policy allows it (else the request stays: the proxy answers 503 no_replica_available)."""

    def __init__(self, pool: ReplicaPool) -> None:
        self._pool = pool

    def idle(self, config: GatewayConfig) -> bool:
        """No policy under `config` detours: the step does nothing."""
        return not any(p.detour for p in config.policies())

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        self._decide(ctx, dry=False)
        return None

    async def dry(self, ctx: RequestContext) -> None:
        self._decide(ctx, dry=True)

    def _decide(self, ctx: RequestContext, dry: bool) -> None:
        down = ctx.route.tier
        if down is None or ctx.model_requested != AUTO_MODEL or down.endpoint != "chat" \
                or self._pool.has_available(down) or (ctx.tenant is not None and not ctx.tenant.detour):
            return
        target = nearest_healthy(ctx.config.routes.tiers, down, ctx.tenant, ctx.max_tokens, self._pool.has_available)
        if target is None:
            return
        ctx.route.tier, ctx.route.rerouted_from = target, down.name
        if not dry:
            log.warning("tier_down_rerouted", request_id=ctx.request_id, from_tier=down.name, to_tier=target.name)
