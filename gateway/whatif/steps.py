"""The server's routing steps, called the way a replay needs them: one module holds every import from the
request path's routing code, so `decide` reads as the steps and a move of that code changes this file only.

The tier (model 'auto': quality floor, bands, default; the tier map, the allowed check, the context window) is
`gateway.routing.tiers.candidate_tier`, the route step's pure function. The session step is
`gateway.routing.session.held_tier` over `LocalSessions` on the log's clock, keyed as the server keys a
conversation (`turn_keys`); the detour is `gateway.routing.detour.nearest_healthy`; spill is
`gateway.routing.spill_decision.spill_tier` on forecasts the log recorded (`decide.Forecasts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gateway.config import GatewayConfig, Spill, TenantPolicy, Tier
from gateway.routing.detour import nearest_healthy
from gateway.routing.session import SessionDecision, held_tier
from gateway.routing.sessions import LocalSessions
from gateway.routing.spill_decision import Forecast, SpillChoice, spill_tier
from gateway.routing.tiers import Asked, TierDecision, candidate_tier

__all__ = ["Asked", "TierDecision", "candidate_tier", "detour_tier", "hold_session", "spill"]


def hold_session(sessions: LocalSessions, parent: str | None, current: str, routed: Tier, ranks: Mapping[str, int],
                 ttl_s: int, now: float, config: GatewayConfig, tenant: TenantPolicy,
                 max_tokens: int | None, record: bool) -> SessionDecision:
    """The session step for a turn routed to `routed`: the tier its conversation holds (looked up by `parent`,
    the conversation through the reply this turn follows; None: a first turn), as `held_tier` decides; when
    `record` (the turn was answered), the conversation through it holds the result (`current`)."""
    before = sessions.get(parent, now) if parent is not None else None
    decision = held_tier(config, tenant, routed, before, max_tokens, ranks)
    if record:
        sessions.put(current, decision.holds, now + ttl_s)
    return decision


def detour_tier(config: GatewayConfig, down: Tier, tenant: TenantPolicy, max_tokens: int | None,
                unhealthy: str) -> Tier | None:
    """The nearest healthy tier for a request routed to `down` while the tier named `unhealthy` had no healthy
    replica (the log's `rerouted_from` says which, and when), as `gateway.routing.detour` decides; None: 503."""
    if down.name != unhealthy or down.endpoint != "chat" or not tenant.detour:
        return None
    return nearest_healthy(config.routes.tiers, down, tenant, max_tokens, lambda tier: tier.name != unhealthy)


def spill(rule: Spill, config: GatewayConfig, tenant: TenantPolicy, decision: TierDecision, chosen: Tier,
          max_tokens: int | None, ttft_s: Callable[[Tier], float | None]) -> SpillChoice:
    """The spill step for a request routed to `chosen`, each tier's predicted TTFT from `ttft_s`: the ladder
    as `SpillStage._ladder` builds it (by quality: the options' order; else the routes file's chat tiers)."""
    qualities = {o.tier: o.quality for o in decision.quality.options} if decision.quality is not None else {}
    tiers = config.tiers
    order: Sequence[Tier] = [tiers[o.tier] for o in decision.quality.options if o.tier in tiers] \
        if chosen.name in qualities and decision.quality is not None else config.routes.tiers
    ladder = [Forecast(t, ttft_s(t), qualities.get(t.name)) for t in order if t is chosen or (
        t.endpoint == "chat" and t.replicas and tenant.allows(t.name)
        and (max_tokens is None or max_tokens <= t.context_window))]
    mine = next((f for f in ladder if f.tier is chosen), Forecast(chosen, ttft_s(chosen), qualities.get(chosen.name)))
    return spill_tier(rule, mine, ladder)

