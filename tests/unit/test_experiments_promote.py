"""`gateway experiments promote`: the policy edit that makes an arm the default, comments and layout kept."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config import GatewayConfig
from gateway.config.loader import load_routes
from gateway.config.policies import PolicyConfig
from gateway.config.tenants import TenantPolicy
from gateway.experiments.promote import PromoteError, promote, unified_diff

ROOT = Path(__file__).resolve().parents[2]
KEY_A, KEY_B = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
POLICY = f"""# the team's policy
default_tier: small-int4            # where auto goes
max_tokens: {{default: 256, maximum: 4096}}

routing:                            # the shipped bands
  bands:
    - {{below: 0.2, tier: small-int4}}
    - {{tier: large-fp16}}

experiments:
  - name: bands-v2                  # a higher cut
    arms:
      - name: ctl
        share: 0.1
        control: true
      - name: higher-cut
        share: 0.1
        routing:
          bands:
            - {{below: 0.4, tier: small-int4}}
            - {{tier: large-fp16}}
        max_tokens: {{default: 128, maximum: 4096}}
  - name: later
    arms: [{{name: x, share: 0.5, default_tier: medium-int8}}]

tenants:
  - name: a                         # key: a
    api_key_sha256: {KEY_A}
  - name: b
    api_key_sha256: {KEY_B}
    experiments:
      - name: map-medium
        arms:
          - {{name: mapped, share: 0.2, tier_map: {{medium-int8: large-fp16}}}}
    priority: batch
"""


def effective(text: str, key: str) -> TenantPolicy:
    routes = load_routes(ROOT / "routes/emulator.yaml")
    return GatewayConfig.build(routes, PolicyConfig.model_validate(yaml.safe_load(text))).tenants_by_key_hash[key]


def test_promoting_an_arm_writes_its_fields_in_place_and_removes_only_that_experiment() -> None:
    result = promote(POLICY, "bands-v2", "higher-cut")
    assert result.scope == "the top level" and result.fields == ("routing", "max_tokens")
    plan = effective(POLICY, KEY_A).plan
    assert plan is not None
    arm_policy = next(a.policy for a in plan.experiments[0].arms if a.arm == "higher-cut")
    after = effective(result.text, KEY_A)
    assert after.routing == arm_policy.routing and after.max_tokens == arm_policy.max_tokens
    assert [e.name for e in after.experiments] == ["later"]
    diff = unified_diff(POLICY, result.text, "policies/team.yaml")
    assert diff.startswith("--- a/policies/team.yaml\n+++ b/policies/team.yaml\n")
    removed = [line for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ["+max_tokens: {default: 128, maximum: 4096}",
                     "+routing: {bands: [{tier: small-int4, below: 0.4}, {tier: large-fp16}]}"]
    assert "-max_tokens: {default: 256, maximum: 4096}" in removed
    assert "-  - name: bands-v2                  # a higher cut" in removed and len(removed) == 1 + 4 + 12
    for kept in ("# the team's policy", "# where auto goes", "  - name: a                         # key: a"):
        assert kept in result.text


def test_the_routing_replaced_in_place_keeps_the_next_key_and_its_comment() -> None:
    text = POLICY.replace("routing:                            # the shipped bands",
                          "routing:                            # the shipped bands\n  classifier: models/difficulty")
    new = promote(text, "bands-v2", "higher-cut").text
    assert "routing:                            # the shipped bands\n" not in new
    assert "\nrouting: {bands: [{tier: small-int4, below: 0.4}, {tier: large-fp16}]}\n\nexperiments:" in new


def test_promoting_the_control_is_the_rollback_and_a_tenant_experiment_is_found_in_its_tenant() -> None:
    rollback = promote(POLICY, "bands-v2", "ctl")
    assert rollback.fields == () and effective(rollback.text, KEY_A).routing == effective(POLICY, KEY_A).routing
    tenant = promote(POLICY, "map-medium", "mapped")
    assert tenant.scope == "tenant b" and tenant.fields == ("tier_map",)
    after = effective(tenant.text, KEY_B)
    assert after.map_tier("medium-int8") == "large-fp16" and after.plan is not None
    assert [e.name for e in after.experiments] == ["bands-v2", "later"]
    assert "    tier_map: {medium-int8: large-fp16}\n    priority: batch\n" in tenant.text
    implicit = promote(POLICY, "map-medium", "control")  # the implicit control arm
    assert "map-medium" not in implicit.text and "tier_map" not in implicit.text


def test_a_flow_style_list_keeps_the_other_experiments() -> None:
    text = (f"default_tier: small-int4\n"
            "experiments: [{name: solo, arms: [{name: c, share: 0.1, control: true}, {name: y, share: 0.1, "
            "default_tier: large-fp16}]}, {name: other, arms: [{name: z, share: 0.1}]}]   # two at once\n"
            f"tenants: [{{name: a, api_key_sha256: {KEY_A}}}]\n")
    new = promote(text, "solo", "y").text
    assert new == ("default_tier: large-fp16\n"
                   "experiments: [{name: other, arms: [{name: z, share: 0.1}]}]   # two at once\n"
                   f"tenants: [{{name: a, api_key_sha256: {KEY_A}}}]\n")


@pytest.mark.parametrize(("name", "arm", "tenant", "message"), [
    ("nope", "x", None, "no experiment 'nope' in the policy"),
    ("bands-v2", "nope", None, "has no arm 'nope' (arms: ctl, higher-cut)"),
    ("map-medium", "mapped", "a", "no experiment 'map-medium' in the policy of tenant 'a'"),
])
def test_unknown_experiments_and_arms_are_refused(name: str, arm: str, tenant: str | None, message: str) -> None:
    with pytest.raises(PromoteError, match=message.replace("(", r"\(").replace(")", r"\)")):
        promote(POLICY, name, arm, tenant)


def test_cli_prints_the_diff_and_writes_with_write(tmp_path: Path) -> None:
    path = tmp_path / "team.yaml"
    path.write_text(POLICY)
    run = [sys.executable, "-m", "gateway", "experiments", "promote", "bands-v2", "higher-cut", "--policy", str(path)]
    shown = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert shown.returncode == 0, shown.stderr
    assert "+routing: {bands:" in shown.stdout and path.read_text() == POLICY
    assert "sets routing, max_tokens in the top level" in shown.stderr
    written = subprocess.run([*run, "--write"], capture_output=True, text=True, cwd=ROOT)
    assert written.returncode == 0 and path.read_text() == promote(POLICY, "bands-v2", "higher-cut").text
    again = subprocess.run(run, capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 1 and "no experiment 'bands-v2'" in again.stderr
