"""Candidate tiers: the requested model names a tier; 'auto' takes the cheapest tier within the tenant's quality
floor (gateway.routing.quality) when the quality predictor scored the prompt, else the difficulty band's tier,
else the default. The tenant's (or its experiment arm's) tier map then names the tier that serves it, before the
allowed check. The reason says why 'auto' went where it went.

`candidate_tier` is the decision as a pure function of the config, the tenant, what the request asks and the
classifier's scores (the route step, `route explain` and `gateway whatif` call it); `RouteStage` is the step of
the request path that calls it and writes the request's context.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import date
from typing import Any, NamedTuple

from gateway.clock import utc_day
from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.context import RequestContext
from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.protocols.embeddings import check_dimensions
from gateway.routing.quality import QualityChoice, choose, tier_options
from gateway.types import AUTO_MODEL, Endpoint, Reply


class Asked(NamedTuple):
    """What a request asks of routing (after the parse and policy stages), and the classifier's scores."""

    endpoint: Endpoint
    model: str | None  # the model asked for: 'auto' or a tier's name
    max_tokens: int | None  # after the tenant's policy
    prompt_tokens: int  # the input's tokens, estimated (`Reading.input_tokens`)
    body: Mapping[str, Any]  # for an embedding request's `dimensions`
    difficulty: float | None = None
    quality: Mapping[str, float] | None = None
    day: date | None = None  # prices' day (None: today, UTC)


class TierDecision(NamedTuple):
    tier: Tier
    reason: str | None  # why 'auto' went there (None: the request named its tier)
    quality: QualityChoice | None  # quality_floor's choice, its options and why


def candidate_tier(config: GatewayConfig, tenant: TenantPolicy | None, asked: Asked) -> TierDecision:
    """The tier serving the request, and why; raises the GatewayError that refuses it (404 unknown model, 403 a
    tier the tenant may not use, 400 a max_tokens over the tier's context window or the wrong endpoint)."""
    model = asked.model
    reason: str | None = None
    quality: QualityChoice | None = None
    if model == AUTO_MODEL:
        chosen, reason, quality = _auto_tier(config, tenant, asked)
    else:
        chosen = model or ""
    tier = served_tier(config, tenant, chosen, model)
    if asked.max_tokens is not None and asked.max_tokens > tier.context_window:
        raise InvalidRequest(
            f"'max_tokens' of {asked.max_tokens} exceeds the context window of tier "
            f"{tier.name!r} ({tier.context_window} tokens)",
            param="max_tokens",
        )
    embeds = tier.endpoint == "embeddings"
    if embeds != (asked.endpoint == "embeddings"):
        kind = "an embedding model" if embeds else "not an embedding model"
        raise InvalidRequest(f"the model {model!r} is {kind}: use it on /v1/"
                             f"{'embeddings' if embeds else 'chat/completions'}", param="model")
    if embeds and tier.dimensions is not None:
        check_dimensions(dict(asked.body), tier.name, tier.dimensions)
    return TierDecision(tier, reason, quality)


class RouteStage:
    """The route step: the candidate tier for the request (`candidate_tier`), written into its context."""

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        ctx.prompt_tokens_est = ctx.input_tokens_est()
        quality = ctx.route.quality  # the day prices the quality floor's choice: only with its scores
        asked = Asked(ctx.endpoint, ctx.model_requested, ctx.max_tokens, ctx.prompt_tokens_est, ctx.body,
                      ctx.route.difficulty, quality, None if quality is None else utc_day(ctx.ts))
        decision = candidate_tier(ctx.config, ctx.tenant, asked)
        ctx.route.tier = decision.tier
        if decision.reason is not None:
            ctx.route.route_reason = decision.reason
        if decision.quality is not None:
            ctx.route.quality_choice = decision.quality
        return None

    async def dry(self, ctx: RequestContext) -> None:
        await self(ctx)  # deciding the tier records nothing


def served_tier(config: GatewayConfig, tenant: TenantPolicy | None, chosen: str, model: str | None) -> Tier:
    """The tier serving a request for `chosen` (a tier name, or what 'auto' chose) after the tenant's tier map:
    404 naming the model asked for when there is none, 403 when the tenant may not use it."""
    tier = config.tiers.get(tenant.map_tier(chosen) if tenant is not None else chosen)
    if tier is None:
        names = ", ".join([AUTO_MODEL, *config.tiers])
        raise UnknownModel(f"the model {model!r} does not exist; use one of: {names}", param="model")
    if tenant is not None and not tenant.allows(tier.name):
        allowed = ", ".join(sorted(tenant.allowed_tiers or ()))
        raise PermissionDenied(f"tenant {tenant.name!r} may not use tier {tier.name!r} (allowed: {allowed})",
                               param="model", code="tier_not_allowed")
    return tier


def _auto_tier(config: GatewayConfig, tenant: TenantPolicy | None,
               asked: Asked) -> tuple[str, str | None, QualityChoice | None]:
    """The quality floor's tier, else the difficulty band's tier where the tenant may use it, else the tenant's
    default tier; and why."""
    if asked.endpoint == "embeddings":  # the first embedding tier the tenant may use, of the dimensions asked for
        embedders = [t for t in config.routes.tiers if t.endpoint == "embeddings"]
        fits = [t for t in embedders if (tenant is None or tenant.allows(t.name))
                and asked.body.get("dimensions") in (None, t.dimensions)]
        chosen = fits or embedders
        return (chosen[0].name if chosen else ""), None, None
    if tenant is None:
        return config.policy.default_tier or "", None, None
    if asked.quality is not None and tenant.quality_floor is not None:
        choice = _quality_tier(config, tenant, asked, tenant.quality_floor)
        if choice is not None:
            return choice.tier, choice.reason, choice
    difficulty = asked.difficulty
    if tenant.routing is None or difficulty is None:
        return tenant.default_tier, f"default tier: {_why_default(tenant, asked)}", None
    band_tier = tenant.routing.tier_for(difficulty)
    if not tenant.allows(band_tier):
        return (tenant.default_tier,
                f"default tier: the band's tier {band_tier} is not allowed (difficulty {difficulty:.4f})", None)
    return band_tier, f"band: difficulty {difficulty:.4f} -> {band_tier}", None


def _quality_tier(config: GatewayConfig, tenant: TenantPolicy, asked: Asked, floor: float) -> QualityChoice | None:
    """The cheapest tier the tenant may use, and whose context fits max_tokens, within `floor` of the best predicted
    quality (None: no such tier)."""
    assert asked.quality is not None
    usable = [t for t in config.routes.tiers if tenant.allows(t.name)
              and (asked.max_tokens is None or asked.max_tokens <= t.context_window)]
    completion = asked.max_tokens if asked.max_tokens is not None else tenant.max_tokens.default
    options = tier_options(asked.quality, usable, prompt_tokens=asked.prompt_tokens,
                           completion_tokens=completion, day=asked.day or utc_day(time.time()))
    return choose(options, floor)


def _why_default(tenant: TenantPolicy, asked: Asked) -> str:
    if tenant.quality_floor is not None and asked.quality is not None:
        return "no tier the tenant may use has a quality prediction"
    if tenant.quality_floor is not None and tenant.routing is None:
        return "no quality prediction (no predictor, or it failed) and no bands"
    if tenant.routing is None:
        return "the tenant routes by neither quality_floor nor bands"
    return "no difficulty score (no classifier, or it failed)"
