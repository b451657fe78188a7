"""Explain a routing decision without making it: tenant, limits applied, each tier's predicted quality and
price (quality_floor), difficulty (bands), tier and why, replica candidates, cache status and why. Nothing is
charged, stored or sent upstream. Used by `gateway route explain` (`lines` renders the report, one fact a line)
and `POST /admin/explain` (the report as JSON)."""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.backends.pool import ReplicaPool
from gateway.backends.urls import redact_url
from gateway.cache.keys import response_key, scope_of, uncached_reasons
from gateway.cache.responses import ResponseCache
from gateway.config import GatewayConfig, Replica, TenantPolicy
from gateway.context import RequestContext
from gateway.errors import GatewayError, InvalidRequest
from gateway.stages.classify import ClassifyStage
from gateway.stages.parse import ParseStage
from gateway.reading import Reading
from gateway.stages.policy import apply_limits
from gateway.stages.route import RouteStage
from gateway.stages.session import SessionStage
from gateway.types import AUTO_MODEL, DifficultyScorer, Endpoint, QualityPredictor


def find_tenant(config: GatewayConfig, name: str) -> TenantPolicy:
    tenants = {t.name: t for t in config.tenants_by_key_hash.values()}
    if config.anonymous is not None:
        tenants[config.anonymous.name] = config.anonymous
    if name not in tenants:
        raise InvalidRequest(f"no tenant {name!r}; known: {', '.join(sorted(tenants))}", param="tenant")
    return tenants[name]


async def explain(config: GatewayConfig, tenant_name: str, body: dict[str, Any], *, endpoint: Endpoint = "chat",
                  scorer: DifficultyScorer | None = None, pool: ReplicaPool | None = None,
                  responses: ResponseCache | None = None,
                  predictor: QualityPredictor | None = None, sessions: SessionStage | None = None,
                  session_header: str | None = None) -> dict[str, Any]:
    """The decision path for `body` sent by tenant `tenant_name`, as a JSON-ready dict."""
    tenant = find_tenant(config, tenant_name)
    pool = pool or ReplicaPool()
    ctx = RequestContext("explain", endpoint, config, orjson.dumps(body), None, time.perf_counter(), time.time())
    report: dict[str, Any] = {"tenant": tenant.name, "config_version": config.version}
    try:
        await ParseStage()(ctx)
        asked = ctx.max_tokens
        ctx.tenant = tenant
        reading = apply_limits(ctx, tenant)
        report["limits"] = _limits(tenant, asked, ctx.max_tokens, reading)
        await ClassifyStage(scorer, predictor)(ctx)
        report["difficulty"] = ctx.difficulty
        report["bands"] = [band.model_dump() for band in tenant.routing.bands] if tenant.routing else None
        await RouteStage(pool)(ctx)
    except GatewayError as err:
        report["decision"] = {"status": err.status, "error": err.message, "param": err.param}
        return report
    assert ctx.tier is not None
    report["quality"] = _quality(ctx, tenant, predictor)
    report["route_reason"] = ctx.route_reason
    report["tier"] = ctx.tier.name
    report["session"] = await (sessions or SessionStage(None, pool)).explain(ctx, session_header)
    report["candidates"] = [_candidate(pool, ctx, r) for r in ctx.candidates]
    report["cache"] = await _cache(ctx, tenant, responses)
    report["decision"] = {"status": 200, "tier": ctx.tier.name, "replica": ctx.candidates[0].name}
    return report


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
    choice = ctx.quality_choice
    report: dict[str, Any] = {"floor": tenant.quality_floor, "predictor": predictor is not None,
                              "predicted": ctx.quality is not None}
    if choice is not None:
        report["tiers"] = [{"tier": o.tier, "quality": round(o.quality, 4), "price_usd": o.price_usd}
                           for o in choice.options]
        report |= {"best": choice.best.tier, "chosen": choice.tier}
    return report


async def _cache(ctx: RequestContext, tenant: TenantPolicy, responses: ResponseCache | None) -> dict[str, Any]:
    assert ctx.tier is not None and ctx.reading is not None
    why = uncached_reasons(ctx.reading, tenant.cache)
    if why:
        return {"status": "bypass", "why": why}
    key = response_key(scope_of(tenant.name, tenant.cache), ctx.tier.name, ctx.reading)
    if responses is None:
        return {"status": "not checked (no Redis)", "key": key}
    return {"status": "hit" if await responses.get(key) else "miss", "key": key}


def _candidate(pool: ReplicaPool, ctx: RequestContext, replica: Replica) -> dict[str, Any]:
    """One replica as the ranking saw it."""
    assert ctx.tier is not None
    state = pool.state(replica, ctx.tier)
    predicted = pool.predict(ctx.tier, replica, ctx.prompt_tokens_est)
    return {"replica": replica.name, "url": redact_url(replica.url), "in_flight": state.in_flight,
            "predicted_ttft_ms": round(predicted * 1000, 3), "circuit": state.breaker.state,
            "healthy": state.healthy, "recent_failures": state.failures}
