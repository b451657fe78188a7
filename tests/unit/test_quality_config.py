"""quality_floor and quality_model in the config files: validated with file, field and reason; inherited,
overridden and turned off like the other limits; hot-reloaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.config.reload import ConfigReloader

ROUTES = """
tiers:
  - name: small
    precision: int4
    context_window: 4096
    prices: {input_per_mtok: 1.0, output_per_mtok: 2.0}
    quality_model: mistral-7b
    replicas: [{name: small-a, url: "http://127.0.0.1:1/v1", model: m}]
  - name: large
    precision: fp16
    context_window: 4096
    prices: {input_per_mtok: 2.0, output_per_mtok: 8.0}
    quality_model: %s
    replicas: [{name: large-a, url: "http://127.0.0.1:1/v1", model: m}]
"""
KEY = "f77894fdfa58e447c57e077eaa9708e8e009c84dc6aba2db80461275e9b85be7"
POLICY = """
default_tier: small
quality_floor: %s
tenants:
  - {name: demo, api_key_sha256: %s}
  - {name: strict, api_key_sha256: %s, quality_floor: 0}
  - {name: bands, api_key_sha256: %s, quality_floor: false}
"""


def write(tmp_path: Path, floor: str = "0.05", large_model: str = "nemotron-51b") -> tuple[Path, Path]:
    routes, policy = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(ROUTES % large_model)
    policy.write_text(POLICY % (floor, KEY, "a" * 64, "b" * 64))
    return routes, policy


def floors(config: GatewayConfig) -> dict[str, float | None]:
    return {t.name: t.quality_floor for t in config.tenants_by_key_hash.values()}


def test_the_floor_is_inherited_overridden_and_turned_off(tmp_path: Path) -> None:
    config = load_config(*write(tmp_path))
    assert floors(config) == {"demo": 0.05, "strict": 0.0, "bands": None}
    assert config.tiers["large"].quality_model == "nemotron-51b"


@pytest.mark.parametrize(("floor", "reason"), [("1.5", "from 0 to 1"), ("-0.1", "from 0 to 1"), ("true", "or false"),
                                               ("lots", "from 0 to 1")])
def test_a_bad_floor_is_refused_with_file_line_field_and_reason(tmp_path: Path, floor: str, reason: str) -> None:
    routes, policy = write(tmp_path, floor)
    with pytest.raises(ConfigError) as err:
        load_config(routes, policy)
    issue = err.value.issues[0]
    assert issue.file == str(policy) and issue.line == 3 and issue.field == "quality_floor"
    assert len(err.value.issues) == 1
    assert any(reason in i.reason for i in err.value.issues), err.value.issues


def test_a_floor_without_two_measured_tiers_is_refused(tmp_path: Path) -> None:
    routes, policy = write(tmp_path)
    routes.write_text((ROUTES % "x").replace("    quality_model: x\n", ""))
    with pytest.raises(ConfigError) as err:
        load_config(routes, policy)
    fields = {i.field for i in err.value.issues}
    assert fields == {"quality_floor", "tenants[1].quality_floor"}  # `false` needs no tiers
    assert all(i.file == str(policy) and "only 'small' has one" in i.reason for i in err.value.issues)


def test_a_bad_quality_model_is_refused(tmp_path: Path) -> None:
    routes, policy = write(tmp_path, large_model='""')
    with pytest.raises(ConfigError) as err:
        load_config(routes, policy)
    assert err.value.issues[0].field == "tiers[1].quality_model" and err.value.issues[0].file == str(routes)


async def test_a_new_floor_is_hot_reloaded_and_a_bad_one_keeps_the_last_good(tmp_path: Path) -> None:
    routes, policy = write(tmp_path)
    served: list[GatewayConfig] = []
    reloader = ConfigReloader(routes, policy, apply=served.append)
    assert await reloader.reload() and floors(served[-1])["demo"] == 0.05
    policy.write_text(POLICY % ("0.2", KEY, "a" * 64, "b" * 64))
    assert await reloader.reload() and floors(served[-1])["demo"] == 0.2
    policy.write_text(POLICY % ("2", KEY, "a" * 64, "b" * 64))
    assert not await reloader.reload() and len(served) == 2
    assert reloader.state.last_error[0].field == "quality_floor"


def test_an_arms_floor_is_promoted_into_the_policy() -> None:
    from gateway.experiments.promote import promote

    text = POLICY % ("0.02", KEY, "a" * 64, "b" * 64) + """experiments:
  - name: looser
    arms:
      - {name: control, share: 0.4, control: true}
      - {name: loose, share: 0.4, quality_floor: 0.1}
      - {name: bands, share: 0.2, quality_floor: false}
"""
    promoted = promote(text, "looser", "loose")
    assert "quality_floor: 0.1\n" in promoted.text and "experiments" not in promoted.text
    assert "quality_floor: false" in promote(text, "looser", "bands").text
