"""Spill under load (issue 39): the pure decision at its boundaries, and the step over a live pool."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig, Spill, Tier
from gateway.context import RequestContext
from gateway.http import _headers
from gateway.metrics import GatewayMetrics
from gateway.routing.quality import QualityChoice, TierOption
from gateway.routing.spill import SpillStage
from gateway.routing.spill_decision import Forecast, spill_tier
from gateway.routing.tiers import RouteStage
from gateway.stages.policy import PolicyStage
from gateway.testing import TEST_API_KEY, gateway_config, parsed_context, tier

SMALL, MEDIUM, LARGE = (tier("small", ["http://127.0.0.1:9/v1"]), tier("medium", ["http://127.0.0.1:10/v1"]),
                        tier("large", ["http://127.0.0.1:11/v1"]))
RULE = Spill(ttft_slo_ms=1000, max_quality_loss=0.02)


def f(t: Tier, ttft_s: float | None, quality: float | None = None) -> Forecast:
    return Forecast(t, ttft_s, quality)


def test_exactly_at_the_slo_is_kept_just_over_spills() -> None:
    ladder = [f(SMALL, 0.1, 0.60), f(LARGE, 1.0, 0.61)]
    kept = spill_tier(RULE, ladder[1], ladder)
    assert kept.tier is LARGE and kept.target is None and kept.spilled_from is None
    over = [f(SMALL, 0.1, 0.60), f(LARGE, 1.0001, 0.61)]
    moved = spill_tier(RULE, over[1], over)
    assert moved.tier is SMALL and moved.spilled_from == "large"
    assert moved.quality_loss == pytest.approx(0.01)


def test_a_target_exactly_at_the_slo_meets_it() -> None:
    ladder = [f(SMALL, 1.0, 0.60), f(LARGE, 3.0, 0.61)]
    assert spill_tier(RULE, ladder[1], ladder).tier is SMALL
    ladder = [f(SMALL, 1.001, 0.60), f(LARGE, 3.0, 0.61)]
    assert spill_tier(RULE, ladder[1], ladder).tier is LARGE


def test_exactly_the_allowed_quality_loss_spills_more_does_not() -> None:
    exact = [f(SMALL, 0.1, 0.60), f(LARGE, 2.0, 0.62)]
    assert spill_tier(RULE, exact[1], exact).tier is SMALL
    more = [f(SMALL, 0.1, 0.5999), f(LARGE, 2.0, 0.62)]
    choice = spill_tier(RULE, more[1], more)
    assert choice.tier is LARGE and choice.target is None and "no tier within the SLO" in choice.reason


def test_the_cheapest_fitting_tier_wins() -> None:
    ladder = [f(SMALL, 0.1, 0.50), f(MEDIUM, 0.2, 0.60), f(LARGE, 2.0, 0.61)]  # small loses too much
    assert spill_tier(RULE, ladder[2], ladder).tier is MEDIUM
    ladder = [f(SMALL, 0.1, 0.60), f(MEDIUM, 0.2, 0.60), f(LARGE, 2.0, 0.61)]
    assert spill_tier(RULE, ladder[2], ladder).tier is SMALL
    ladder = [f(SMALL, 1.5, 0.60), f(MEDIUM, 0.2, 0.60), f(LARGE, 2.0, 0.61)]  # small is queued too
    assert spill_tier(RULE, ladder[2], ladder).tier is MEDIUM
    ladder = [f(SMALL, None, 0.60), f(MEDIUM, 2.0, 0.60), f(LARGE, 2.0, 0.61)]  # none may be tried; queued
    assert spill_tier(RULE, ladder[2], ladder).target is None


def test_bands_only_goes_to_the_next_tier_down_and_no_further() -> None:
    ladder = [f(SMALL, 0.1), f(MEDIUM, 0.2), f(LARGE, 2.0)]
    choice = spill_tier(RULE, ladder[2], ladder)
    assert choice.tier is MEDIUM and choice.quality_loss is None
    ladder = [f(SMALL, 0.1), f(MEDIUM, 1.5), f(LARGE, 2.0)]  # the next one down is queued: small is not taken
    assert spill_tier(RULE, ladder[2], ladder).tier is LARGE
    ladder = [f(SMALL, 0.1), f(MEDIUM, 2.0), f(LARGE, 0.1)]  # never up without spill_up
    assert spill_tier(RULE, ladder[1], ladder).tier is SMALL
    ladder = [f(SMALL, 2.0), f(MEDIUM, 0.1)]  # nothing below the smallest
    assert spill_tier(RULE, ladder[0], ladder).tier is SMALL


def test_spill_up_takes_an_idle_dearer_tier() -> None:
    up = Spill(ttft_slo_ms=1000, max_quality_loss=0.02, spill_up=True)
    ladder = [f(SMALL, 2.5, 0.60), f(LARGE, 0.2, 0.70)]
    assert spill_tier(RULE, ladder[0], ladder).tier is SMALL
    choice = spill_tier(up, ladder[0], ladder)
    assert choice.tier is LARGE and choice.spilled_from == "small" and choice.quality_loss == pytest.approx(-0.1)
    bands = [f(SMALL, 0.1), f(MEDIUM, 2.0), f(LARGE, 0.1)]  # bands: down first, then up
    assert spill_tier(up, bands[1], bands).tier is SMALL
    bands = [f(SMALL, 1.1), f(MEDIUM, 2.0), f(LARGE, 0.1)]
    assert spill_tier(up, bands[1], bands).tier is LARGE


# the step over a pool: one replica per tier, two slots; a queue is requests in flight beyond them

SLOTS_TIERS = [Tier.model_validate({**t.model_dump(), "slots_per_replica": 2}) for t in (SMALL, LARGE)]


def config(spill: dict[str, Any] | bool | None, tenant_spill: dict[str, Any] | bool | None = None) -> GatewayConfig:
    tenant: dict[str, Any] = {"name": "test-tenant", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}
    if tenant_spill is not None:
        tenant["spill"] = tenant_spill
    policy: dict[str, Any] = {"routing": {"bands": [{"tier": "small", "below": 0.5}, {"tier": "large"}]},
                              "tenants": [tenant]}
    if spill is not None:
        policy["spill"] = spill
    return gateway_config(SLOTS_TIERS, policy=policy)


def load(pool: ReplicaPool, cfg: GatewayConfig, name: str, in_flight: int, e2e_s: float = 2.0) -> None:
    t = cfg.tiers[name]
    state = pool.state(t.replicas[0], t)
    state.in_flight, state.e2e_s = in_flight, e2e_s


async def spilled(cfg: GatewayConfig, pool: ReplicaPool, difficulty: float, model: str = "auto",
                  metrics: GatewayMetrics | None = None, dry: bool = False) -> RequestContext:
    ctx = await parsed_context(cfg, {"model": model, "messages": [{"role": "user", "content": "Hi"}]})
    await PolicyStage()(ctx)
    ctx.route.difficulty = difficulty
    await RouteStage()(ctx)
    step = SpillStage(pool, metrics=metrics)
    await (step.dry(ctx) if dry else step(ctx))
    return ctx


def spills(metrics: GatewayMetrics, source: str, target: str) -> float:
    value = metrics.registry.get_sample_value("gateway_spills_total", {"from_tier": source, "to_tier": target})
    return value or 0.0


async def test_a_queued_tier_spills_to_the_next_tier_down_with_header_and_metric() -> None:
    cfg, pool, metrics = config({"ttft_slo_ms": 500}), ReplicaPool(), GatewayMetrics()
    load(pool, cfg, "large", in_flight=4)  # 3 ahead x 2 s / 2 slots = 3 s queued
    ctx = await spilled(cfg, pool, 0.9, metrics=metrics)
    assert ctx.route.tier is not None and ctx.route.tier.name == "small"
    assert ctx.route.spill is not None and ctx.route.spill.spilled_from == "large"
    assert _headers(ctx)["x-gateway-spilled-from"] == "large"
    assert ctx.route.route_reason is not None and ctx.route.route_reason.startswith("spilled: large predicted")
    report = ctx.route.spill.report()
    assert report["from"]["tier"] == "large" and report["from"]["ttft_ms"] > 3000  # type: ignore[index]
    assert report["to"]["tier"] == "small" and report["to"]["ttft_ms"] < 500  # type: ignore[index]
    assert spills(metrics, "large", "small") == 1


async def test_an_idle_tier_is_kept_and_nothing_is_counted() -> None:
    cfg, pool, metrics = config({"ttft_slo_ms": 500}), ReplicaPool(), GatewayMetrics()
    ctx = await spilled(cfg, pool, 0.9, metrics=metrics)
    assert ctx.route.tier is not None and ctx.route.tier.name == "large"
    assert ctx.route.spill is not None and ctx.route.spill.target is None
    assert "x-gateway-spilled-from" not in _headers(ctx)
    assert spills(metrics, "large", "small") == 0


async def test_no_spill_without_the_rule_for_a_named_model_or_turned_off() -> None:
    pool = ReplicaPool()
    for cfg, model in ((config(None), "auto"), (config({"ttft_slo_ms": 500}), "large"),
                       (config({"ttft_slo_ms": 500}, tenant_spill=False), "auto")):
        load(pool, cfg, "large", in_flight=4)
        ctx = await spilled(cfg, pool, 0.9, model=model)
        assert ctx.route.tier is not None and ctx.route.tier.name == "large" and ctx.route.spill is None


async def test_spill_up_from_a_saturated_small_tier() -> None:
    pool = ReplicaPool()
    for up, served in ((False, "small"), (True, "large")):
        cfg = config({"ttft_slo_ms": 500, "spill_up": up})
        load(pool, cfg, "small", in_flight=4)
        ctx = await spilled(cfg, pool, 0.1)
        assert ctx.route.tier is not None and ctx.route.tier.name == served


async def test_the_admission_wait_counts_as_queue() -> None:
    cfg, pool = config({"ttft_slo_ms": 500}), ReplicaPool()
    ctx = await parsed_context(cfg, {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]})
    await PolicyStage()(ctx)
    ctx.route.difficulty = 0.9
    await RouteStage()(ctx)
    await SpillStage(pool, wait=lambda t, _: 2.0 if t.name == "large" else 0.0)(ctx)
    assert ctx.route.tier is not None and ctx.route.tier.name == "small"


async def test_by_quality_the_loss_bounds_the_spill() -> None:
    cfg, pool = config({"ttft_slo_ms": 500, "max_quality_loss": 0.05}), ReplicaPool()
    load(pool, cfg, "large", in_flight=4)
    for small_quality, served in ((0.56, "small"), (0.54, "large")):
        ctx = await parsed_context(cfg, {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]})
        await PolicyStage()(ctx)
        ctx.route.tier = cfg.tiers["large"]
        options = (TierOption("small", small_quality, 0.001), TierOption("large", 0.6, 0.01))
        ctx.route.quality_choice = QualityChoice(options[1], options[1], 0.0, options)
        await SpillStage(pool)(ctx)
        assert ctx.route.tier.name == served


async def test_dry_decides_the_same_and_counts_nothing() -> None:
    cfg, pool, metrics = config({"ttft_slo_ms": 500}), ReplicaPool(), GatewayMetrics()
    load(pool, cfg, "large", in_flight=4)
    ctx = await spilled(cfg, pool, 0.9, metrics=metrics, dry=True)
    assert ctx.route.tier is not None and ctx.route.tier.name == "small"
    assert spills(metrics, "large", "small") == 0
