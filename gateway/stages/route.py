"""Route: the requested model names a tier; 'auto' takes the difficulty band's tier (or the default).
The tenant's (or its experiment arm's) tier map then names the tier that serves it, before the allowed check."""

from __future__ import annotations

from collections.abc import Callable

from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.context import RequestContext
from gateway.detour import detour
from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.protocols.embeddings import check_dimensions
from gateway.types import AUTO_MODEL, Reply


class RouteStage:
    def __init__(self, pool: ReplicaPool, shadow: Callable[[RequestContext], None] | None = None) -> None:
        self._pool = pool
        self._shadow = shadow  # once the tier is known: whether the answer is shadowed (gateway.experiments.serving)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        config = ctx.config
        model = ctx.model_requested
        chosen = _auto_tier(ctx) if model == AUTO_MODEL else model or ""
        tier = config.tiers.get(ctx.tenant.map_tier(chosen) if ctx.tenant is not None else chosen)
        if tier is None:
            names = ", ".join([AUTO_MODEL, *config.tiers])
            raise UnknownModel(f"the model {model!r} does not exist; use one of: {names}", param="model")
        if ctx.tenant is not None and not ctx.tenant.allows(tier.name):
            allowed = ", ".join(sorted(ctx.tenant.allowed_tiers or ()))
            raise PermissionDenied(f"tenant {ctx.tenant.name!r} may not use tier {tier.name!r} (allowed: {allowed})",
                                   param="model", code="tier_not_allowed")
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
        ctx.prompt_tokens_est = estimate_tokens(len(ctx.prompt_text()))
        ctx.candidates = self._pool.rank(tier, ctx.prompt_tokens_est, config.routes.balancing)
        if not ctx.candidates and model == AUTO_MODEL:
            detour(ctx, self._pool)  # no healthy replica: the nearest healthy tier (gateway.detour)
        if self._shadow is not None:
            self._shadow(ctx)
        return None


def _auto_tier(ctx: RequestContext) -> str:
    """The difficulty band's tier where the tenant may use it, else the tenant's default tier."""
    tenant = ctx.tenant
    if ctx.endpoint == "embeddings":  # the first embedding tier the tenant may use, of the dimensions asked for
        embedders = [t for t in ctx.config.routes.tiers if t.endpoint == "embeddings"]
        fits = [t for t in embedders if (tenant is None or tenant.allows(t.name))
                and ctx.body.get("dimensions") in (None, t.dimensions)]
        chosen = fits or embedders
        return chosen[0].name if chosen else ""
    if tenant is None:
        return ctx.config.policy.default_tier or ""
    if tenant.routing is None or ctx.difficulty is None:
        return tenant.default_tier
    band_tier = tenant.routing.tier_for(ctx.difficulty)
    return band_tier if tenant.allows(band_tier) else tenant.default_tier
