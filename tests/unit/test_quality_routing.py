"""quality_floor: the cheapest tier within the floor of the best predicted quality (gateway.routing.quality),
through the classify and route stages: a predictor failure falls back to the bands, never fails the request."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.config import GatewayConfig
from gateway.routing.quality import TierOption, choose, gain, tier_options
from gateway.stages.classify import ClassifyStage
from gateway.stages.policy import PolicyStage
from gateway.backends.pool import ReplicaPool
from gateway.testing import TableQualityPredictor, TableScorer, gateway_config, parsed_context, routed as route_steps, tier

SMALL, MEDIUM, LARGE = "mistral-7b", "llama-70b", "nemotron-51b"
TODAY = date(2026, 11, 27)


def options(*triples: tuple[str, float, float]) -> list[TierOption]:
    return [TierOption(name, quality, price) for name, quality, price in triples]


def test_the_cheapest_tier_within_the_floor_of_the_best_wins() -> None:
    opts = options(("large", 0.80, 3.0), ("small", 0.76, 1.0), ("medium", 0.79, 2.0))
    assert choose(opts, 0.05).tier == "small"  # type: ignore[union-attr]
    assert choose(opts, 0.02).tier == "medium"  # type: ignore[union-attr]
    assert choose(opts, 0.0).tier == "large"  # type: ignore[union-attr]
    assert choose(options(("large", 0.2, 3.0), ("small", 0.9, 1.0)), 0.0).tier == "small"  # type: ignore[union-attr]
    assert choose([], 0.1) is None


def test_a_floor_of_one_always_takes_the_cheapest_and_equal_bests_the_cheaper() -> None:
    opts = options(("small", 0.0, 1.0), ("large", 1.0, 3.0))
    assert choose(opts, 1.0).tier == "small"  # type: ignore[union-attr]
    assert choose(options(("large", 0.7, 3.0), ("small", 0.7, 1.0)), 0.0).tier == "small"  # type: ignore[union-attr]


def test_the_reason_names_the_chosen_and_the_best_tier() -> None:
    opts = options(("small", 0.76, 1.0), ("large", 0.80, 3.0))
    within = choose(opts, 0.05)
    above = choose(opts, 0.01)
    assert within is not None and above is not None
    assert "small (0.760)" in within.reason and "large (0.800)" in within.reason and "0.05" in within.reason
    assert above.tier == "large" and "small 0.760" in above.reason and above.reason.isascii()


def test_gain_is_the_dearest_minus_the_cheapest() -> None:
    assert gain(options(("large", 0.9, 3.0), ("small", 0.6, 1.0), ("medium", 0.1, 2.0))) == pytest.approx(0.3)
    assert gain(options(("small", 0.6, 1.0))) is None


def test_tier_options_use_each_tiers_quality_model_and_price() -> None:
    tiers = [tier("small", ["http://127.0.0.1:1/v1"], output_per_mtok=1.0, quality_model=SMALL),
             tier("large", ["http://127.0.0.1:1/v1"], output_per_mtok=8.0, quality_model=LARGE),
             tier("other", ["http://127.0.0.1:1/v1"], quality_model="not-predicted"),
             tier("plain", ["http://127.0.0.1:1/v1"])]
    opts = tier_options({SMALL: 0.5, LARGE: 0.7, "not-predicted": float("nan")}, tiers, prompt_tokens=1000,
                        completion_tokens=1000, day=TODAY)
    assert [(o.tier, o.quality) for o in opts] == [("small", 0.5), ("large", 0.7)]
    assert opts[0].price_usd == pytest.approx((1000 * 1.0 + 1000 * 1.0) / 1e6)
    assert opts[1].price_usd == pytest.approx((1000 * 1.0 + 1000 * 8.0) / 1e6)


def config(policy: dict[str, Any] | None = None) -> GatewayConfig:
    tiers = [tier("small", ["http://127.0.0.1:1/v1"], output_per_mtok=1.0, quality_model=SMALL),
             tier("medium", ["http://127.0.0.1:1/v1"], output_per_mtok=4.0, quality_model=MEDIUM),
             tier("large", ["http://127.0.0.1:1/v1"], output_per_mtok=8.0, quality_model=LARGE)]
    bands = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}
    return gateway_config(tiers, policy={"routing": bands, "quality_floor": 0.05, **(policy or {})})


PREDICTIONS = {
    "easy": {SMALL: 0.90, MEDIUM: 0.92, LARGE: 0.93},
    "hard": {SMALL: 0.30, MEDIUM: 0.70, LARGE: 0.80},
    "middling": {SMALL: 0.50, MEDIUM: 0.78, LARGE: 0.80},
}


async def route(cfg: GatewayConfig, prompt: str, predictor: TableQualityPredictor | None,
                scorer: TableScorer | None = None, model: str = "auto") -> Any:
    ctx = await parsed_context(cfg, {"model": model, "messages": [{"role": "user", "content": prompt}]})
    await PolicyStage()(ctx)
    await ClassifyStage(scorer, predictor)(ctx)
    await route_steps(ctx, ReplicaPool())
    return ctx


@pytest.mark.parametrize(("prompt", "expected"), [("easy", "small"), ("middling", "medium"), ("hard", "large")])
async def test_auto_takes_the_cheapest_tier_within_the_floor(prompt: str, expected: str) -> None:
    scorer = TableScorer({})
    ctx = await route(config(), prompt, TableQualityPredictor(PREDICTIONS), scorer)
    assert ctx.route.tier.name == expected
    assert ctx.route.quality_choice.tier == expected and ctx.route.route_reason.startswith("quality: ")
    assert ctx.route.difficulty is None and scorer.calls == []  # the bands were not needed


async def test_a_failing_predictor_falls_back_to_the_bands_and_is_logged() -> None:
    predictor = TableQualityPredictor(PREDICTIONS, error=RuntimeError("router gone"))
    with capture_logs() as logs:
        ctx = await route(config(), "easy", predictor, TableScorer({"easy": 0.9}))
    assert ctx.route.tier.name == "large" and ctx.route.difficulty == 0.9 and ctx.route.quality_choice is None
    assert ctx.route.route_reason == "band: difficulty 0.9000 -> large"
    assert any(e["event"] == "quality_predictor_failed" and "router gone" in e["error"] for e in logs)


async def test_without_a_predictor_or_a_classifier_auto_takes_the_default_tier() -> None:
    ctx = await route(config(), "hard", None, None)
    assert ctx.route.tier.name == "small" and "no difficulty score" in ctx.route.route_reason


async def test_the_floor_is_per_tenant_and_off_with_false() -> None:
    predictor = TableQualityPredictor(PREDICTIONS)
    ctx = await route(config({"quality_floor": False}), "hard", predictor, TableScorer({"hard": 0.1}))
    assert ctx.route.tier.name == "small" and predictor.calls == []  # the bands: difficulty 0.1


async def test_an_explicit_tier_and_disallowed_tiers_are_respected() -> None:
    predictor = TableQualityPredictor(PREDICTIONS)
    ctx = await route(config(), "hard", predictor, model="small")
    assert ctx.route.tier.name == "small" and predictor.calls == []
    ctx = await route(config({"allowed_tiers": ["small", "medium"]}), "hard", predictor)
    assert ctx.route.tier.name == "medium" and [o.tier for o in ctx.route.quality_choice.options] == ["small", "medium"]


async def test_a_tier_too_small_for_max_tokens_is_not_a_choice() -> None:
    cfg = config()
    tiers = [t.model_copy(update={"context_window": 100}) if t.name == "small" else t for t in cfg.routes.tiers]
    cfg = GatewayConfig.build(cfg.routes.model_copy(update={"tiers": tuple(tiers)}), cfg.policy)
    body = {"model": "auto", "max_tokens": 500, "messages": [{"role": "user", "content": "easy"}]}
    ctx = await parsed_context(cfg, body)
    await PolicyStage()(ctx)
    await ClassifyStage(None, TableQualityPredictor(PREDICTIONS))(ctx)
    await route_steps(ctx, ReplicaPool())
    assert ctx.route.tier.name == "medium" and [o.tier for o in ctx.route.quality_choice.options] == ["medium", "large"]


async def test_a_predictor_without_the_tiers_models_leaves_the_default_tier() -> None:
    ctx = await route(config(), "x", TableQualityPredictor({}, default={"unrelated": 0.5}))
    assert ctx.route.tier.name == "small" and "no tier the tenant may use has a quality prediction" in ctx.route.route_reason


async def test_an_experiment_arm_sets_its_own_floor() -> None:
    cfg = config({"experiments": [{"name": "floor", "arms": [{"name": "strict", "share": 0.4, "quality_floor": 0.0},
                                                            {"name": "loose", "share": 0.4, "quality_floor": 1.0}]}]})
    tenant = next(iter(cfg.tenants_by_key_hash.values()))
    assert tenant.plan is not None
    floors = {a.arm: a.policy.quality_floor for a in tenant.plan.experiments[0].arms}
    assert floors == {"strict": 0.0, "loose": 1.0, "control": 0.05}
