"""Explain a routing decision without making it: tenant, limits applied, each tier's predicted quality and
price (quality_floor), difficulty (bands), tier and why, the session, replica candidates, cache status and why.

The route's own steps decide, in their dry mode (`RoutingStep.dry`: the same decision from the same state,
nothing recorded, no exploration spent): `POST /admin/explain` runs the serving gateway's steps over its live
replica health and load; `gateway route explain` runs them over the files (replica health unknown) or, with
`--url`, asks a running gateway. Nothing is charged, stored or sent upstream. `explain_text.lines` renders the
report, one fact a line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from gateway.backends.pool import ReplicaPool
from gateway.backends.urls import redact_url
from gateway.cache.keys import response_key, scope_of, uncached_reasons
from gateway.cache.responses import ResponseCache
from gateway.config import GatewayConfig, Replica, TenantPolicy
from gateway.context import RequestContext
from gateway.errors import GatewayError, InvalidRequest
from gateway.reading import Reading
from gateway.routing.affinity import AffinityStage
from gateway.routing.detour import DetourStage
from gateway.routing.ranking import RankStage
from gateway.routing.session import SessionStage
from gateway.routing.sessions import SessionStore
from gateway.routing.spill import SpillStage
from gateway.routing.tiers import RouteStage
from gateway.stages.classify import ClassifyStage
from gateway.stages.parse import ParseStage
from gateway.stages.policy import apply_limits
from gateway.types import AUTO_MODEL, DifficultyScorer, Endpoint, QualityPredictor


class RoutingStep(Protocol):
    """A step of the route in its dry mode (gateway.pipeline.RequestPath.routing_steps)."""

    async def dry(self, ctx: RequestContext) -> None: ...


def file_steps(pool: ReplicaPool, sessions: SessionStore | None = None) -> tuple[RoutingStep, ...]:
    """The route's steps over a pool that has seen no traffic (`route explain` from the files)."""
    return (RouteStage(), SessionStage(sessions), DetourStage(pool), SpillStage(pool), AffinityStage(), RankStage(pool))


def find_tenant(config: GatewayConfig, name: str) -> TenantPolicy:
    tenants = {t.name: t for t in config.tenants_by_key_hash.values()}
    if config.anonymous is not None:
        tenants[config.anonymous.name] = config.anonymous
    if name not in tenants:
        raise InvalidRequest(f"no tenant {name!r}; known: {', '.join(sorted(tenants))}", param="tenant")
    return tenants[name]


async def explain(config: GatewayConfig, tenant_name: str, body: dict[str, Any], *, endpoint: Endpoint = "chat",
                  scorer: DifficultyScorer | None = None, pool: ReplicaPool | None = None,
                  responses: ResponseCache | None = None, predictor: QualityPredictor | None = None,
                  steps: Sequence[RoutingStep] | None = None, session_header: str | None = None,
                  live: bool = False) -> dict[str, Any]:
    """The decision path for `body` sent by tenant `tenant_name`, as a JSON-ready dict. `steps`: the route's
    steps (default: `file_steps` over `pool`); `live`: the pool is the serving gateway's (health and load known)."""
    tenant = find_tenant(config, tenant_name)
    pool = pool or ReplicaPool()
    ctx = RequestContext("explain", endpoint, config, orjson.dumps(body), None, time.perf_counter(), time.time())
    ctx.session_header = session_header
    report: dict[str, Any] = {"tenant": tenant.name, "config_version": config.version, "live": live}
    try:
        await ParseStage()(ctx)
        asked = ctx.max_tokens
        ctx.tenant = tenant
        reading = apply_limits(ctx, tenant)
        report["limits"] = _limits(tenant, asked, ctx.max_tokens, reading)
        await ClassifyStage(scorer, predictor)(ctx)
        report["difficulty"] = ctx.route.difficulty
        report["bands"] = [band.model_dump() for band in tenant.routing.bands] if tenant.routing else None
        for step in steps if steps is not None else file_steps(pool):
            await step.dry(ctx)
            if isinstance(step, SessionStage):
                report["session"] = _session(step, ctx)
    except GatewayError as err:
        report["decision"] = {"status": err.status, "error": err.message, "param": err.param}
        return report
    assert ctx.route.tier is not None
    report["quality"] = _quality(ctx, tenant, predictor)
    report["route_reason"] = ctx.route.route_reason
    report["tier"] = ctx.route.tier.name
    if ctx.route.rerouted_from is not None:
        report["rerouted_from"] = ctx.route.rerouted_from
    if ctx.route.spill is not None:  # what spill would do at the current load (from the files: an idle fleet)
        report["spill"] = ctx.route.spill.report()
    report["candidates"] = [_candidate(pool, ctx, r, live) for r in ctx.route.candidates]
    report["cache"] = await _cache(ctx, tenant, responses)
    if ctx.route.candidates or not ctx.route.tier.replicas:
        report["decision"] = {"status": 200, "tier": ctx.route.tier.name,
                              "replica": ctx.route.candidates[0].name if ctx.route.candidates else None}
    else:  # as the proxy would answer
        report["decision"] = {"status": 503, "param": None, "error": f"no replica of tier {ctx.route.tier.name!r} is "
                              "available (circuit open or failing health checks)"}
    return report


def _session(step: SessionStage, ctx: RequestContext) -> dict[str, Any] | None:
    """What the session did to this turn (None: sessions do not apply to the request)."""
    tenant = ctx.tenant
    if tenant is None or tenant.sessions is None or not step.applies(ctx) and ctx.route.session_route is None:
        return None
    ttl_s = tenant.sessions.ttl_s
    if step.store is None:
        return {"id": None, "holds": None, "ttl_s": ttl_s,
                "effect": "not checked (no session store: give gateway route explain --url or --redis URL)"}
    route, tier = ctx.route.session_route, ctx.route.tier.name if ctx.route.tier is not None else None
    effect = {"new": "new session: its tier would be the routed one (a first turn inherits nothing without an "
                     "x-session-id)",
              "kept": "kept", "upgraded": "the routed tier would serve (an upgrade)",
              "held": f"held: the session's tier {tier} would serve, not the routed {ctx.route.session_from}"}
    return {"id": ctx.route.session, "holds": None if route == "new" else tier, "ttl_s": ttl_s,
            "effect": effect.get(route or "", "none")}


def _limits(tenant: TenantPolicy, asked: int | None, applied: int | None, reading: Reading) -> dict[str, Any]:
    return {
        "max_tokens": {"asked": asked, "applied": applied, **tenant.max_tokens.model_dump()},
        "prompt_chars": reading.input_chars, "max_prompt_chars": tenant.max_prompt_chars,
        "prompt_tokens_est": reading.input_tokens, "max_prompt_tokens": tenant.max_prompt_tokens,
        "outputs": reading.outputs, "rate_limit_charge": reading.charge(),
        "output_cap": tenant.output_cap.model_dump() if tenant.output_cap else None,
        "stop": list(tenant.stop), "priority": tenant.priority, "ttft_slo_ms": tenant.ttft_slo_ms,
        "rate_limit": tenant.rate_limit.model_dump() if tenant.rate_limit else None,
        "daily_budget_usd": tenant.daily_budget_usd,
        "allowed_tiers": sorted(tenant.allowed_tiers) if tenant.allowed_tiers is not None else None,
    }


def _quality(ctx: RequestContext, tenant: TenantPolicy, predictor: QualityPredictor | None) -> dict[str, Any] | None:
    """quality_floor's view: the floor, each tier's predicted quality and price, the best and the chosen tier
    (None when the floor does not apply: the tenant has none, or the request names its tier)."""
    if tenant.quality_floor is None or ctx.model_requested != AUTO_MODEL or ctx.endpoint == "embeddings":
        return None
    choice = ctx.route.quality_choice
    report: dict[str, Any] = {"floor": tenant.quality_floor, "predictor": predictor is not None,
                              "predicted": ctx.route.quality is not None}
    if choice is not None:
        report["tiers"] = [{"tier": o.tier, "quality": round(o.quality, 4), "price_usd": o.price_usd}
                           for o in choice.options]
        report |= {"best": choice.best.tier, "chosen": choice.tier}
    return report


async def _cache(ctx: RequestContext, tenant: TenantPolicy, responses: ResponseCache | None) -> dict[str, Any]:
    assert ctx.route.tier is not None and ctx.reading is not None
    why = uncached_reasons(ctx.reading, tenant.cache)
    if why:
        return {"status": "bypass", "why": why}
    key = response_key(scope_of(tenant.name, tenant.cache), ctx.route.tier.name, ctx.reading)
    if responses is None:
        return {"status": "not checked (no Redis)", "key": key}
    return {"status": "hit" if await responses.get(key) else "miss", "key": key}


def _candidate(pool: ReplicaPool, ctx: RequestContext, replica: Replica, live: bool) -> dict[str, Any]:
    """One replica as the ranking saw it (health and load: None when not live, only known to a serving gateway)."""
    assert ctx.route.tier is not None
    state = pool.state(replica, ctx.route.tier)
    predicted = pool.predict(ctx.route.tier, replica, ctx.prompt_tokens_est)
    return {"replica": replica.name, "url": redact_url(replica.url), "in_flight": state.in_flight if live else None,
            "predicted_ttft_ms": round(predicted * 1000, 3), "circuit": state.breaker.state if live else None,
            "healthy": state.healthy if live else None, "recent_failures": state.failures if live else None}
