"""The server's routing steps, called the way a replay needs them: one module holds every import from the
request path's routing code, so `decide` reads as the steps and a move of that code changes this file only.

The tier (model 'auto': quality floor, bands, default; the tier map, the allowed check, the context window) is
`gateway.routing.tiers.candidate_tier`, the route step's pure function. The session step and the detour call
the pure pieces the session stage and `gateway.routing.detour` are made of (`LocalSessions` on the log's
clock, `nearest_healthy`).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.routing.detour import nearest_healthy
from gateway.routing.sessions import Held, LocalSessions
from gateway.routing.tiers import Asked, TierDecision, candidate_tier

__all__ = ["Asked", "TierDecision", "candidate_tier", "detour_tier", "hold_session"]


def hold_session(sessions: LocalSessions, key: str, routed: Tier, ranks: Mapping[str, int], ttl_s: int,
                 now: float, config: GatewayConfig, tenant: TenantPolicy, max_tokens: int | None) -> tuple[Tier, str]:
    """The tier serving a turn of session `key` routed to `routed`, and the session's effect ("new", "kept",
    "upgraded", "held"), as the session stage decides it (a session only moves up, in routes order)."""
    before = sessions.get(key, now)
    turn = Held(ranks[routed.name], routed.name)
    held = turn if before is None or turn.rank > before.rank else before
    sessions.put(key, held, now + ttl_s)
    target = config.tiers.get(held.tier)
    if held.tier == routed.name or target is None or not _may_serve(tenant, target, max_tokens):
        return routed, "new" if before is None else "upgraded" if turn.rank > before.rank else "kept"
    return target, "held"


def _may_serve(tenant: TenantPolicy, tier: Tier, max_tokens: int | None) -> bool:
    """The session stage's rule: the tenant may use the tier, it serves chat, and max_tokens fits."""
    return tenant.allows(tier.name) and tier.endpoint == "chat" and (max_tokens is None or
                                                                      max_tokens <= tier.context_window)


def detour_tier(config: GatewayConfig, down: Tier, tenant: TenantPolicy, max_tokens: int | None,
                unhealthy: str) -> Tier | None:
    """The nearest healthy tier for a request routed to `down` while the tier named `unhealthy` had no healthy
    replica (the log's `rerouted_from` says which, and when), as `gateway.routing.detour` decides; None: 503."""
    if down.name != unhealthy or down.endpoint != "chat" or not tenant.detour:
        return None
    return nearest_healthy(config.routes.tiers, down, tenant, max_tokens, lambda tier: tier.name != unhealthy)
