"""Admission: the last stage before the proxy. A request that would miss its tenant's TTFT SLO is
shed at once (503 + Retry-After: honest, and cheaper than a timeout); one that may wait queues for
a slot of its tier for at most its deadline; 'auto' traffic of tenants that allow it browns out to
the tier's `brownout_to` tier when its own is saturated. After the cache: a hit takes no slot.
"""

from __future__ import annotations

import time
from typing import NoReturn

import structlog

from gateway.admission.gate import TierGate
from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig, Tier
from gateway.config.policies import Priority
from gateway.context import RequestContext
from gateway.errors import GatewayError, Overloaded
from gateway.metrics import GatewayMetrics
from gateway.routing.ranking import RankStage
from gateway.types import AUTO_MODEL, Reply

log = structlog.get_logger("gateway.admission")


class AdmissionStage:
    def __init__(self, pool: ReplicaPool, metrics: GatewayMetrics, choice: RankStage) -> None:
        self._pool = pool
        self._metrics = metrics
        self._choice = choice  # the replica choice, made again after a wait and for brownout
        self._gates: dict[str, TierGate] = {}

    @property
    def gates(self) -> dict[str, TierGate]:
        """The tiers' gates so far (the dashboard reads their limits and queues)."""
        return self._gates

    def gate(self, ctx: RequestContext, tier: Tier) -> TierGate:
        gate = self._gates.get(tier.name)
        if gate is None:
            gate = self._gates[tier.name] = TierGate(tier.name, ctx.config.routes.admission, self._metrics)
            gate.capacity = self._pool.capacity(tier)
        return gate

    def wait(self, tier: Tier, priority: Priority) -> float:
        """Seconds a request of `priority` would wait for a slot of `tier` now (0: room, or no gate yet)."""
        gate = self._gates.get(tier.name)
        return 0.0 if gate is None else gate.expected_wait(priority)

    def configure(self, config: GatewayConfig) -> None:
        """A new config version: the gates take its settings and their tiers' capacity (learned limits stay)."""
        for tier in config.routes.tiers:
            gate = self._gates.get(tier.name)
            if gate is not None:
                gate.settings = config.routes.admission
                gate.capacity = self._pool.capacity(tier)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        if not ctx.config.routes.admission.enabled or ctx.route.tier is None or not ctx.route.candidates:
            return None
        tenant = ctx.tenant
        priority = tenant.priority if tenant else "interactive"
        slo_s = tenant.ttft_slo_ms / 1000 if tenant and tenant.ttft_slo_ms else None
        gate = self.gate(ctx, ctx.route.tier)
        predicted = self._predicted(ctx)
        if not gate.has_room() or (slo_s is not None and predicted > slo_s):
            gate, predicted = await self._brownout(ctx, gate, predicted)
        if slo_s is not None:
            wait = gate.expected_wait(priority)
            if predicted + wait > slo_s and not self._idle(ctx, wait):
                self._shed(ctx, gate, Overloaded(
                    f"tier {gate.tier!r} would answer in about {(predicted + wait) * 1000:.0f} ms, over the "
                    f"{slo_s * 1000:.0f} ms TTFT objective of tenant {ctx.tenant_name!r}",
                    code="predicted_slo_miss", retry_after=max(wait, predicted)))
        max_wait = slo_s - predicted if slo_s is not None else ctx.config.routes.admission.max_wait_ms / 1000
        queued_at = time.perf_counter()
        try:
            permit = await gate.acquire(ctx.tenant_name, priority, max_wait)
        except Overloaded as err:
            ctx.queue_ms = (time.perf_counter() - queued_at) * 1000  # a refusal after a wait logs the wait
            self._shed(ctx, gate, err)
        ctx.queue_ms = permit.waited_s * 1000
        ctx.first_byte_hooks.append(permit.sample)
        ctx.finishers.append(lambda _: permit.release())
        if permit.waited_s > 0:
            await self._after_wait(ctx, gate, permit.waited_s, slo_s)
        return None

    async def _after_wait(self, ctx: RequestContext, gate: TierGate, waited_s: float, slo_s: float | None) -> None:
        """The replicas' load changed while the request waited: rank them again, and shed it if the
        wait plus the new prediction now misses its SLO (it would miss anyway, and load the fleet)."""
        assert ctx.route.tier is not None
        (await self._choice.choose(ctx, ctx.route.tier)).apply(ctx)
        if not ctx.route.candidates:
            return  # the proxy says no replica is available
        predicted = self._predicted(ctx)
        if slo_s is not None and waited_s + predicted > slo_s:
            self._shed(ctx, gate, Overloaded(
                f"tier {gate.tier!r} would answer after {(waited_s + predicted) * 1000:.0f} ms in all, over the "
                f"{slo_s * 1000:.0f} ms TTFT objective of tenant {ctx.tenant_name!r}",
                code="predicted_slo_miss", retry_after=predicted))

    def _idle(self, ctx: RequestContext, wait: float) -> bool:
        """Nothing of ours runs on the best replica and no slot wait: a prediction over the SLO is then
        more likely stale than true, and only a request sent now can refresh it (never shed by it)."""
        assert ctx.route.tier is not None
        return wait == 0 and self._pool.state(ctx.route.candidates[0], ctx.route.tier).in_flight == 0

    def _predicted(self, ctx: RequestContext) -> float:
        assert ctx.route.tier is not None
        first = ctx.route.candidates[0]
        cached = ctx.route.prefix_tokens if ctx.route.prefix_replica == first.name else 0
        ctx.route.predicted_ttft_s = self._pool.predict(ctx.route.tier, first, ctx.prompt_tokens_est, cached)
        ctx.route.predicted_on = first
        return ctx.route.predicted_ttft_s

    async def _brownout(self, ctx: RequestContext, gate: TierGate, predicted: float) -> tuple[TierGate, float]:
        """Move 'auto' traffic to the faster tier when the policy lets it and that tier has room."""
        tier, tenant = ctx.route.tier, ctx.tenant
        if tier is None or tenant is None or not tenant.brownout or ctx.model_requested != AUTO_MODEL:
            return gate, predicted
        target = ctx.config.tiers.get(tier.brownout_to or "")
        if target is None or not tenant.allows(target.name):
            return gate, predicted
        if ctx.max_tokens is not None and ctx.max_tokens > target.context_window:
            return gate, predicted
        target_gate = self.gate(ctx, target)
        if not target_gate.has_room():
            return gate, predicted
        choice = await self._choice.choose(ctx, target)
        if not choice.replicas:
            return gate, predicted
        first = choice.replicas[0]
        warm = choice.prefix_tokens if choice.prefix_replica == first.name else 0
        target_predicted = self._pool.predict(target, first, ctx.prompt_tokens_est, warm)
        if target_predicted >= predicted:
            return gate, predicted
        ctx.route.brownout(tier.name, target)
        choice.apply(ctx)
        ctx.cache_key = None  # this answer comes from another tier: never store it under the first one's key
        ctx.route.predicted_ttft_s, ctx.route.predicted_on = target_predicted, first
        self._metrics.brownouts.labels(tier.name, target.name).inc()
        log.info("brownout", request_id=ctx.request_id, from_tier=tier.name, to_tier=target.name)
        return target_gate, target_predicted

    def _shed(self, ctx: RequestContext, gate: TierGate, err: GatewayError) -> NoReturn:
        self._metrics.shed.labels(gate.tier, err.code or "overloaded").inc()
        ctx.result.flag(err.code)
        raise err
