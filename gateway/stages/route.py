"""Route: the requested model names a tier; 'auto' takes the cheapest tier within the tenant's quality floor
(gateway.routing.quality) when the quality predictor scored the prompt, else the difficulty band's tier, else
the default. The tenant's (or its experiment arm's) tier map then names the tier that serves it, before the
allowed check. `ctx.route_reason` says why 'auto' went where it went."""

from __future__ import annotations

from collections.abc import Callable

from gateway.backends.pool import ReplicaPool
from gateway.clock import utc_day
from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.context import RequestContext
from gateway.routing.detour import detour
from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.protocols.embeddings import check_dimensions
from gateway.routing.quality import choose, tier_options
from gateway.stages.session import SessionStage
from gateway.types import AUTO_MODEL, Reply


class RouteStage:
    def __init__(self, pool: ReplicaPool, shadow: Callable[[RequestContext], None] | None = None,
                 sessions: SessionStage | None = None) -> None:
        self._pool = pool
        self._sessions = sessions  # a conversation keeps its tier, moving only up (issue 32)
        self._shadow = shadow  # once the tier is known: whether the answer is shadowed (gateway.experiments.serving)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        config = ctx.config
        model = ctx.model_requested
        chosen = _auto_tier(ctx) if model == AUTO_MODEL else model or ""
        tier = served_tier(config, ctx.tenant, chosen, model)
        if ctx.max_tokens is not None and ctx.max_tokens > tier.context_window:
            raise InvalidRequest(
                f"'max_tokens' of {ctx.max_tokens} exceeds the context window of tier "
                f"{tier.name!r} ({tier.context_window} tokens)",
                param="max_tokens",
            )
        embeds = tier.endpoint == "embeddings"
        if embeds != (ctx.endpoint == "embeddings"):
            kind = "an embedding model" if embeds else "not an embedding model"
            raise InvalidRequest(f"the model {model!r} is {kind}: use it on /v1/"
                                 f"{'embeddings' if embeds else 'chat/completions'}", param="model")
        if embeds and tier.dimensions is not None:
            check_dimensions(ctx.body, tier.name, tier.dimensions)
        ctx.tier = tier
        ctx.prompt_tokens_est = ctx.input_tokens_est()
        ctx.candidates = self._pool.rank(tier, ctx.prompt_tokens_est, config.routes.balancing)
        if self._sessions is not None and ctx.tenant is not None and ctx.tenant.sessions is not None:
            await self._sessions(ctx)  # a conversation keeps its tier, moving only up (issue 32)
        if not ctx.candidates and model == AUTO_MODEL:
            detour(ctx, self._pool)  # no healthy replica: the nearest healthy tier (gateway.routing.detour)
        if self._shadow is not None:
            self._shadow(ctx)
        return None


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


def _auto_tier(ctx: RequestContext) -> str:
    """The quality floor's tier, else the difficulty band's tier where the tenant may use it, else the tenant's
    default tier; `ctx.route_reason` says which."""
    tenant = ctx.tenant
    if ctx.endpoint == "embeddings":  # the first embedding tier the tenant may use, of the dimensions asked for
        embedders = [t for t in ctx.config.routes.tiers if t.endpoint == "embeddings"]
        fits = [t for t in embedders if (tenant is None or tenant.allows(t.name))
                and ctx.body.get("dimensions") in (None, t.dimensions)]
        chosen = fits or embedders
        return chosen[0].name if chosen else ""
    if tenant is None:
        return ctx.config.policy.default_tier or ""
    if ctx.quality is not None and tenant.quality_floor is not None:
        if (tier := _quality_tier(ctx, tenant.quality_floor)) is not None:
            return tier
    if tenant.routing is None or ctx.difficulty is None:
        ctx.route_reason = f"default tier: {_why_default(ctx)}"
        return tenant.default_tier
    band_tier = tenant.routing.tier_for(ctx.difficulty)
    if not tenant.allows(band_tier):
        ctx.route_reason = f"default tier: the band's tier {band_tier} is not allowed (difficulty {ctx.difficulty:.4f})"
        return tenant.default_tier
    ctx.route_reason = f"band: difficulty {ctx.difficulty:.4f} -> {band_tier}"
    return band_tier


def _quality_tier(ctx: RequestContext, floor: float) -> str | None:
    """The cheapest tier the tenant may use, and whose context fits max_tokens, within `floor` of the best predicted
    quality (None: no such tier)."""
    tenant = ctx.tenant
    assert tenant is not None and ctx.quality is not None
    usable = [t for t in ctx.config.routes.tiers if tenant.allows(t.name)
              and (ctx.max_tokens is None or ctx.max_tokens <= t.context_window)]
    completion = ctx.max_tokens if ctx.max_tokens is not None else tenant.max_tokens.default
    options = tier_options(ctx.quality, usable, prompt_tokens=ctx.input_tokens_est(),
                           completion_tokens=completion, day=utc_day(ctx.ts))
    choice = choose(options, floor)
    if choice is None:
        return None
    ctx.quality_choice, ctx.route_reason = choice, choice.reason
    return choice.tier


def _why_default(ctx: RequestContext) -> str:
    tenant = ctx.tenant
    assert tenant is not None
    if tenant.quality_floor is not None and ctx.quality is not None:
        return "no tier the tenant may use has a quality prediction"
    if tenant.quality_floor is not None and tenant.routing is None:
        return "no quality prediction (no predictor, or it failed) and no bands"
    if tenant.routing is None:
        return "the tenant routes by neither quality_floor nor bands"
    return "no difficulty score (no classifier, or it failed)"
