"""The `experiments:`, `shadow:` and `tier_map:` policy fields: validation, cross-checks against the routes
file and the tenant's allowed tiers, and the compiled per-arm policies."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.config.loader import load_routes
from gateway.config.policies import PolicyConfig

ROOT = Path(__file__).resolve().parents[2]
KEY = hashlib.sha256(b"k").hexdigest()
ROUTES = load_routes(ROOT / "routes/emulator.yaml")  # small-int4, medium-int8, large-fp16
BANDS = {"bands": [{"below": 0.5, "tier": "small-int4"}, {"tier": "large-fp16"}]}


def policy(**fields: Any) -> dict[str, Any]:
    tenant = {"name": "t", "api_key_sha256": KEY, **fields.pop("tenant", {})}
    return {"default_tier": "small-int4", **fields, "tenants": [tenant]}


def errors(data: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as caught:
        PolicyConfig.model_validate(data)
    return str(caught.value)


def build(data: dict[str, Any]) -> GatewayConfig:
    return GatewayConfig.build(ROUTES, PolicyConfig.model_validate(data))


def experiment(*arms: dict[str, Any], name: str = "e") -> dict[str, Any]:
    return {"name": name, "arms": list(arms)}


@pytest.mark.parametrize(("arms", "message"), [
    ([{"name": "a", "share": 0.6}, {"name": "b", "share": 0.5}], "arm shares sum to 1.1, more than 1"),
    ([{"name": "a", "share": 0.5, "control": True}, {"name": "b", "share": 0.5, "control": True}],
     "exactly one control arm, got 2"),
    ([{"name": "a", "share": 0.5, "control": True, "default_tier": "large-fp16"}],
     "the control arm 'a' must not override anything (got default_tier)"),
    ([{"name": "a", "share": 0.5}, {"name": "a", "share": 0.1}], "arm names must be unique"),
    ([{"name": "control", "share": 0.5}], "an arm named 'control' must set `control: true`"),
    ([{"name": "a", "share": 1.0}], "leave a share for the implicit control"),
    ([{"name": "a", "share": 0.0}], "greater than 0"),
    ([{"name": "a b", "share": 0.1}], "should match pattern"),
    ([], "at least 1 item"),
])
def test_arms_are_refused_with_a_reason(arms: list[dict[str, Any]], message: str) -> None:
    assert message in errors(policy(experiments=[experiment(*arms)]))


def test_an_experiment_taking_every_request_must_come_last() -> None:
    first = experiment({"name": "a", "share": 0.2}, name="first")  # implicit control: the other 80 %
    second = experiment({"name": "b", "share": 0.2}, name="second")
    assert "experiment 'first' takes every request, so 'second'" in errors(policy(experiments=[first, second]))
    explicit = experiment({"name": "ctl", "share": 0.2, "control": True}, {"name": "a", "share": 0.2}, name="first")
    PolicyConfig.model_validate(policy(experiments=[explicit, second]))  # 60 % outside `first`: fine
    assert "experiment names must be unique" in errors(policy(experiments=[explicit, {**second, "name": "first"}]))


def test_shadow_reads_from_and_to_and_refuses_one_tier() -> None:
    rule = PolicyConfig.model_validate(policy(shadow={"share": 0.1, "from": "small-int4", "to": "large-fp16"})).shadow
    assert rule is not None and (rule.from_tier, rule.to_tier, rule.max_pairs, rule.judge) == (
        "small-int4", "large-fp16", 10000, None)
    assert "name the same tier" in errors(policy(shadow={"share": 0.1, "from": "small-int4", "to": "small-int4"}))
    assert "Extra inputs" in errors(policy(shadow={"share": 0.1, "from_tier": "a", "to": "b"}))


def test_every_tier_an_experiment_or_shadow_names_must_exist_in_the_routes(tmp_path: Path) -> None:
    arm = {"name": "a", "share": 0.5, "default_tier": "huge", "routing": {"bands": [{"tier": "nope"}]},
           "tier_map": {"medium-int8": "medium-int3"}}
    data = policy(tenant={"experiments": [experiment(arm)],
                          "shadow": {"share": 0.1, "from": "small-int4", "to": "large", "judge": "judge-tier"}},
                  tier_map={"tiny": "small-int4"})
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as caught:
        load_config(ROOT / "routes/emulator.yaml", file)
    found = {(issue.field, issue.value) for issue in caught.value.issues}
    assert found == {
        ("tier_map.tiny", "'tiny'"),
        ("tenants[0].experiments[0].arms[0].default_tier", "'huge'"),
        ("tenants[0].experiments[0].arms[0].routing.bands[0].tier", "'nope'"),
        ("tenants[0].experiments[0].arms[0].tier_map.medium-int8", "'medium-int3'"),
        ("tenants[0].shadow.to", "'large'"),
        ("tenants[0].shadow.judge", "'judge-tier'"),
    }
    assert all(issue.file == str(file) and "no such tier in routes" in issue.reason for issue in caught.value.issues)


def test_an_arm_may_not_send_a_tenant_outside_its_allowed_tiers() -> None:
    arm = {"name": "a", "share": 0.5, "default_tier": "large-fp16", "tier_map": {"small-int4": "medium-int8"}}
    data = policy(experiments=[experiment(arm)], tenant={"allowed_tiers": ["small-int4", "medium-int8"]})
    with pytest.raises(ConfigError) as caught:
        build(data)
    (issue,) = caught.value.issues
    assert (issue.field, issue.value) == ("experiments[0].arms[0].default_tier", "'large-fp16'")
    assert "tenant 't' may not use this tier (allowed_tiers: medium-int8, small-int4)" in issue.reason
    data["tenants"][0]["experiments"] = []  # the tenant leaves the top level's experiments
    assert build(data).tenants_by_key_hash[KEY].plan is None


def test_each_arm_compiles_to_the_tenant_policy_with_its_fields_in_place() -> None:
    arm = {"name": "big", "share": 0.3, "default_tier": "large-fp16", "routing": BANDS,
           "tier_map": {"medium-int8": "large-fp16"}, "max_tokens": {"default": 64, "maximum": 128}}
    config = build(policy(experiments=[experiment(arm)], max_tokens={"default": 16, "maximum": 4096},
                          ttft_slo_ms=900, tier_map={"small-int4": "medium-int8"}))
    tenant = config.tenants_by_key_hash[KEY]
    assert tenant.plan is not None and tenant.map_tier("small-int4") == "medium-int8"
    (compiled,) = tenant.plan.experiments
    assert [a.arm for a in compiled.arms] == ["big", "control"] and compiled.cuts == pytest.approx((0.3, 1.0))
    big, control = compiled.arms
    assert big.overrides == ("routing", "default_tier", "tier_map", "max_tokens") and not big.control
    effective = big.policy
    assert effective.default_tier == "large-fp16" and effective.max_tokens.maximum == 128
    assert effective.routing is not None and effective.routing.tier_for(0.7) == "large-fp16"
    assert effective.map_tier("medium-int8") == "large-fp16" and effective.map_tier("small-int4") == "small-int4"
    assert effective.ttft_slo_ms == 900 and effective.name == "t"  # everything else is the tenant's
    assert effective.plan is None and effective.experiments == ()  # no second assignment on the arm's policy
    assert control.control and control.overrides == ()
    assert control.policy.default_tier == "small-int4" and control.policy.max_tokens.maximum == 4096
    assert control.policy.map_tier("small-int4") == "medium-int8"


def test_a_tenant_inherits_the_top_level_experiments_and_shadow() -> None:
    data = policy(experiments=[experiment({"name": "a", "share": 0.5})],
                  shadow={"share": 0.05, "from": "small-int4", "to": "large-fp16", "max_pairs": 50})
    data["allow_anonymous"] = True
    config = build(data)
    for tenant in (config.tenants_by_key_hash[KEY], config.anonymous):
        assert tenant is not None and tenant.plan is not None and tenant.shadow is not None
        assert tenant.shadow.max_pairs == 50


def test_the_worked_example_loads_with_the_emulator_routes_and_promotes_cleanly() -> None:
    from gateway.experiments.promote import promote

    config = load_config(ROOT / "routes/emulator.yaml", ROOT / "policies/experiments-example.yaml")
    demo = next(t for t in config.tenants_by_key_hash.values() if t.name == "demo")
    batch = next(t for t in config.tenants_by_key_hash.values() if t.name == "team-batch")
    assert demo.plan is not None and [e.name for e in demo.plan.experiments] == ["higher-cut", "int4-for-medium"]
    assert demo.shadow is not None and demo.shadow.to_tier == "large-fp16"
    assert batch.plan is None and batch.shadow is not None  # `experiments: []` opts out of the experiments only
    text = (ROOT / "policies/experiments-example.yaml").read_text()
    promoted = promote(text, "higher-cut", "raise-cut").text
    assert "- {below: 0.1617, tier: medium-int8}" not in promoted and "{tier: medium-int8, below: 0.25}" in promoted
