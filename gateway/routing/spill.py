"""Spill: model 'auto' whose chosen tier is queued goes to a tier predicted to answer within the tenant's TTFT SLO.

Per tenant, `spill: {ttft_slo_ms: N, max_quality_loss: Q, spill_up: false}` (issue 39). When the chosen tier's best
replica's predicted TTFT (the number the ranking computes, the backend's queue included, plus the wait for a slot
of the tier's admission gate) exceeds N, the cheapest tier the tenant may use whose prediction meets N and whose
predicted quality (quality_floor's predictions) is at most Q below the chosen tier's serves instead; with no
quality prediction (bands only) that is the next tier down. `spill_up` lets a dearer tier serve too (a saturated
small tier, an idle large one: with predictions, one at most Q below, usually above; bands only: the next tier up
when the one down does not meet the SLO). Else the choice stays (admission then queues or sheds).

Exactly at the SLO is within it (no spill); exactly Q below is allowed. Said in the `x-gateway-spilled-from`
response header, the log line (`spilled_from` with both tiers' predicted TTFT and quality), the `gateway_spills`
metric, the dashboard and `route explain` (what it would do at the current load).

`spill_tier` is the decision, a pure function of the rule and the tiers' forecasts (`gateway whatif` can call it);
`SpillStage` is the step of the request path that forecasts each tier over the live pool and admission gates.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.config.policies import Priority
from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.routing.spill_decision import Forecast, SpillChoice, ms, spill_tier
from gateway.types import AUTO_MODEL, Reply

log = structlog.get_logger("gateway.route")

Wait = Callable[[Tier, Priority], float]  # seconds a request would wait for a slot of the tier's admission gate


class SpillStage:
    """The spill step over the live pool: each tier's best predicted TTFT plus its admission wait (`wait`)."""

    def __init__(self, pool: ReplicaPool, wait: Wait | None = None, metrics: GatewayMetrics | None = None) -> None:
        self._pool = pool
        self._wait = wait
        self._metrics = metrics

    def idle(self, config: GatewayConfig) -> bool:
        """No policy under `config` spills: the step does nothing."""
        return not any(p.spill is not None for p in config.policies())

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        self._decide(ctx, dry=False)
        return None

    async def dry(self, ctx: RequestContext) -> None:
        self._decide(ctx, dry=True)

    def forecast(self, ctx: RequestContext, tier: Tier, quality: float | None = None) -> Forecast:
        """`tier`'s best replica's predicted TTFT for this request, plus the wait for a slot of its gate."""
        tokens = ctx.prompt_tokens_est
        best = min((self._pool.predict(tier, r, tokens) for r in tier.replicas
                    if self._pool.state(r, tier).available()), default=None)
        if best is not None and self._wait is not None:
            best += self._wait(tier, ctx.tenant.priority if ctx.tenant is not None else "interactive")
        return Forecast(tier, best, quality)

    def _decide(self, ctx: RequestContext, dry: bool) -> None:
        tenant, tier = ctx.tenant, ctx.route.tier
        if tenant is None or tenant.spill is None or tier is None or ctx.model_requested != AUTO_MODEL \
                or tier.endpoint != "chat" or not tier.replicas:
            return
        qualities = {o.tier: o.quality for o in ctx.route.quality_choice.options} if ctx.route.quality_choice else {}
        chosen = self.forecast(ctx, tier, qualities.get(tier.name))
        if chosen.ttft_s is not None and chosen.ttft_s <= tenant.spill.ttft_slo_ms / 1000:
            ctx.route.spill = SpillChoice(tier, chosen, None, tenant.spill.ttft_slo_ms / 1000,
                                    f"kept {tier.name}: {ms(chosen.ttft_s)} within the SLO")
            return  # the common case: nothing else forecast
        ladder = [chosen if t is tier else self.forecast(ctx, t, qualities.get(t.name))
                  for t in self._ladder(ctx, tenant, tier, qualities)]
        choice = spill_tier(tenant.spill, chosen, ladder)
        ctx.route.spill = choice
        if choice.target is None:
            return
        ctx.route.tier = choice.tier
        ctx.route.route_reason = f"{choice.reason} ({ctx.route.route_reason})" if ctx.route.route_reason else choice.reason
        if not dry:
            if self._metrics is not None:
                self._metrics.spill(tier.name, choice.tier.name, choice.quality_loss)
            log.info("spilled", request_id=ctx.request_id, from_tier=tier.name, to_tier=choice.tier.name)

    @staticmethod
    def _ladder(ctx: RequestContext, tenant: TenantPolicy, chosen: Tier,
                qualities: dict[str, float]) -> list[Tier]:
        """The tiers that may serve the request, cheapest first: by quality, those with a prediction in the
        options' (price) order; else the chat tiers in the routes file's order."""
        tiers = ctx.config.tiers
        if chosen.name in qualities:
            assert ctx.route.quality_choice is not None
            order = [tiers[o.tier] for o in ctx.route.quality_choice.options if o.tier in tiers]
        else:
            order = list(ctx.config.routes.tiers)
        return [t for t in order if t is chosen or (
            t.endpoint == "chat" and t.replicas and tenant.allows(t.name)
            and (ctx.max_tokens is None or ctx.max_tokens <= t.context_window))]
