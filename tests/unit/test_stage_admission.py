"""The admission stage called directly: shedding a predicted SLO miss, queueing for a slot, a full queue,
brownout, the replica choice made again after a wait (affinity kept), and a reload's settings."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.cache.prefix import PrefixMatch
from gateway.config import GatewayConfig, Tier
from gateway.context import RequestContext
from gateway.errors import Overloaded
from gateway.metrics import GatewayMetrics
from gateway.stages.admission import AdmissionStage
from gateway.routing.affinity import AffinityStage
from gateway.routing.ranking import RankStage
from gateway.stages.policy import PolicyStage
from gateway.testing import gateway_config, parsed_context, routed as route, run_finishers, tier

URLS = [f"http://127.0.0.1:{port}/v1" for port in (9, 10, 11)]
ONE_SLOT = {"initial_limit": 1, "min_limit": 1, "max_limit": 1}
PROMPT = "Summarise the following text in one sentence. " * 10  # 470 characters: ~117 tokens
CHAT: dict[str, Any] = {"model": "t", "messages": [{"role": "user", "content": PROMPT}]}


class WarmOn:
    """A PrefixStore stand-in: every prompt's first 4 blocks are warm on `replica`."""

    block_chars = 64

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.lookups = 0

    async def lookup(self, tier: str, scope: str, prefix_text: str) -> PrefixMatch:
        self.lookups += 1
        return PrefixMatch(self.replica, 4, 4 * self.block_chars)


@dataclass
class Admission:
    pool: ReplicaPool
    metrics: GatewayMetrics
    affinity: AffinityStage
    stage: AdmissionStage

    @classmethod
    def over(cls, prefixes: WarmOn | None = None) -> Admission:
        pool, metrics = ReplicaPool(), GatewayMetrics()
        affinity = AffinityStage(prefixes)  # type: ignore[arg-type]
        return cls(pool, metrics, affinity, AdmissionStage(pool, metrics, RankStage(pool, affinity)))

    async def routed(self, config: GatewayConfig, body: dict[str, Any] = CHAT) -> RequestContext:
        """A context through parse, policy, the route, affinity and the ranking: what admission gets."""
        ctx = await parsed_context(config, body)
        await PolicyStage()(ctx)
        await route(ctx, self.pool)
        await self.affinity(ctx)
        await RankStage(self.pool, self.affinity)(ctx)
        return ctx

    async def admitted(self, config: GatewayConfig, body: dict[str, Any] = CHAT) -> RequestContext:
        ctx = await self.routed(config, body)
        assert await self.stage(ctx) is None
        return ctx

    def shed(self, tier: str, reason: str) -> float | None:
        return self.metrics.registry.get_sample_value("gateway_shed_total", {"tier": tier, "reason": reason})


def slow(pool: ReplicaPool, tier: Tier, seconds: float) -> None:
    """The tier's first replica was seen to answer in `seconds` (nothing queued ahead)."""
    pool.state(tier.replicas[0], tier).observe_ttft(seconds, work=1, queue_s=0.0, alpha=0.2)


async def test_a_predicted_slo_miss_is_shed_when_the_replica_is_busy_and_sent_when_it_is_idle() -> None:
    config = gateway_config([tier("t", URLS[:1])], policy={"ttft_slo_ms": 100})
    t = config.tiers["t"]
    admission = Admission.over()
    slow(admission.pool, t, 0.3)
    idle = await admission.admitted(config)  # over the SLO, but nothing runs there: the prediction may be stale
    assert idle.route.predicted_ttft_s is not None and idle.route.predicted_ttft_s > 0.29 and len(idle.finishers) == 1
    Lease(admission.pool, t.replicas[0], t, 10, 0, config.routes.balancing)  # now one of ours runs there
    ctx = await admission.routed(config)
    with pytest.raises(Overloaded) as caught:
        await admission.stage(ctx)
    error = caught.value
    assert (error.status, error.code) == (503, "predicted_slo_miss")
    assert "over the 100 ms TTFT objective of tenant 'test-tenant'" in error.message
    assert error.retry_after is not None and error.retry_after > 0.29
    assert ctx.result.error == "predicted_slo_miss" and ctx.finishers == []
    assert admission.shed("t", "predicted_slo_miss") == 1


async def test_a_request_queues_for_a_slot_and_takes_the_one_released() -> None:
    config = gateway_config([tier("t", URLS[:1])], admission=ONE_SLOT)
    admission = Admission.over()
    first = await admission.admitted(config)
    second = await admission.routed(config)
    waiting = asyncio.create_task(admission.stage(second))
    await asyncio.sleep(0.05)
    gate = admission.stage.gates["t"]
    assert not waiting.done() and len(gate.queue) == 1 and gate.in_flight == 1
    run_finishers(first)  # the first answer is done: its permit goes back
    assert await asyncio.wait_for(waiting, 1.0) is None
    assert (gate.in_flight, len(gate.queue), first.queue_ms) == (1, 0, 0.0)
    assert second.queue_ms >= 45 and len(second.finishers) == 1


async def test_a_full_queue_is_shed_at_once() -> None:
    config = gateway_config([tier("t", URLS[:1])], admission={**ONE_SLOT, "max_queue": 0})
    admission = Admission.over()
    await admission.admitted(config)
    ctx = await admission.routed(config)
    with pytest.raises(Overloaded) as caught:
        await admission.stage(ctx)
    assert (caught.value.status, caught.value.code, ctx.result.error) == (503, "queue_full", "queue_full")
    assert admission.shed("t", "queue_full") == 1


def brownout_config(brownout: bool = True) -> GatewayConfig:
    """'large' (one slot, no queue) browns out to 'small'; model 'auto' goes to 'large'."""
    large = tier("large", URLS[:1]).model_copy(update={"brownout_to": "small"})
    return gateway_config([large, tier("small", URLS[1:2])], policy={"brownout": brownout},
                          admission={**ONE_SLOT, "max_queue": 0})


async def test_auto_traffic_browns_out_to_the_faster_tier_when_its_own_is_saturated() -> None:
    config = brownout_config()
    admission = Admission.over()
    slow(admission.pool, config.tiers["large"], 0.5)
    auto = {**CHAT, "model": "auto"}
    held = await admission.admitted(config, auto)  # room: it stays
    assert held.route.tier is not None and held.route.tier.name == "large" and held.route.brownout_from is None
    ctx = await admission.routed(config, auto)
    ctx.cache_key = "resp:large-key"  # a cache miss on the first tier
    assert await admission.stage(ctx) is None
    assert ctx.route.tier is not None and (ctx.route.tier.name, ctx.route.brownout_from) == ("small", "large")
    assert ctx.route.candidates == config.tiers["small"].replicas and ctx.cache_key is None  # never stored as large's
    assert ctx.route.predicted_ttft_s is not None and ctx.route.predicted_ttft_s < 0.1
    assert admission.stage.gates["small"].in_flight == 1 and admission.stage.gates["large"].in_flight == 1
    labels = {"from_tier": "large", "to_tier": "small"}
    assert admission.metrics.registry.get_sample_value("gateway_brownouts_total", labels) == 1


@pytest.mark.parametrize(("model", "brownout"), [("large", True), ("auto", False)],
                         ids=["a named tier", "a tenant without brownout"])
async def test_no_brownout_for_a_named_tier_or_a_tenant_without_it(model: str, brownout: bool) -> None:
    config = brownout_config(brownout)
    admission = Admission.over()
    slow(admission.pool, config.tiers["large"], 0.5)
    await admission.admitted(config, {**CHAT, "model": model})
    ctx = await admission.routed(config, {**CHAT, "model": model})
    with pytest.raises(Overloaded) as caught:
        await admission.stage(ctx)
    assert caught.value.code == "queue_full"
    assert ctx.route.tier is not None and ctx.route.tier.name == "large" and ctx.route.brownout_from is None


async def test_after_a_queue_wait_the_replicas_are_ranked_again_with_the_affine_one_first() -> None:
    config = gateway_config([tier("t", URLS)], admission=ONE_SLOT)
    t = config.tiers["t"]
    prefixes = WarmOn("t-1")
    admission = Admission.over(prefixes)
    first = await admission.admitted(config)
    second = await admission.routed(config)
    assert [r.name for r in second.route.candidates] == ["t-1", "t-0", "t-2"]  # the affinity stage's choice
    waiting = asyncio.create_task(admission.stage(second))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    admission.pool.state(t.replicas[2]).healthy = False  # the fleet changed while it waited
    run_finishers(first)
    assert await asyncio.wait_for(waiting, 1.0) is None and second.queue_ms > 0
    assert [r.name for r in admission.pool.rank(t, second.prompt_tokens_est, config.routes.balancing)] == [
        "t-0", "t-1"]  # the ranking alone would put t-0 first ...
    assert [r.name for r in second.route.candidates] == ["t-1", "t-0"]  # ... the choice made again keeps the warm one
    assert (second.route.prefix_replica, second.route.prefix_blocks) == ("t-1", 4)
    assert second.route.prefix_tokens == estimate_tokens(4 * 64) == 64
    assert prefixes.lookups == 2  # the first request and the second: ranked again after its wait, not looked up again


async def test_configure_gives_existing_gates_the_new_settings_and_capacity_and_keeps_their_limit() -> None:
    config = gateway_config([tier("t", URLS[:2]), tier("u", URLS[2:])], admission={"max_queue": 5})
    admission = Admission.over()
    await admission.admitted(config)
    gate = admission.stage.gates["t"]
    assert (gate.settings.max_queue, gate.capacity, gate.slots) == (5, None, 32)
    gate.limiter.limit = 20.0  # what it learned
    reloaded = gateway_config([tier("t", URLS[:2]).model_copy(update={"slots_per_replica": 3}), tier("u", URLS[2:])],
                              admission={"max_queue": 0})
    admission.stage.configure(reloaded)
    assert admission.stage.gates["t"] is gate and gate.settings is reloaded.routes.admission
    assert (gate.settings.max_queue, gate.capacity, gate.limiter.limit, gate.slots) == (0, 6, 20.0, 6)
    assert set(admission.stage.gates) == {"t"}  # a gate is made on a tier's first request, not on reload


async def test_with_admission_off_every_request_passes_untouched() -> None:
    config = gateway_config([tier("t", URLS[:1])], admission={"enabled": False})
    admission = Admission.over()
    ctx = await admission.admitted(config)
    assert (ctx.finishers, ctx.first_byte_hooks, admission.stage.gates) == ([], [], {})
