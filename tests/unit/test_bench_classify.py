"""bench/classify_throughput.py's configs and route check (gateway.bench.classify): with --quality-floor the
routed tenant must route by predicted quality, and a run that took another route must say so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.bench.classify import (
    PLAIN_KEY, TIERS, bands_of, expected_route, route_kind, route_mismatches, routed_tenant, shipped_cuts,
    vllm_quality_models,
)
from gateway.bench.configs import key_sha256, policy_yaml, routes_yaml
from gateway.config import load_config
from gateway.config.tenants import routes_by_quality

ROOT = Path(__file__).resolve().parents[2]
CLASSIFIER = ROOT / "models" / "difficulty"


def test_the_tiers_take_the_vllm_routes_rungs() -> None:
    assert vllm_quality_models() == {"small-int4": "llama-3.1-8b-instruct",
                                     "medium-int8": "llama-3.3-nemotron-super-49b-v1",
                                     "large-fp16": "llama-3.1-nemotron-51b-instruct"}


def write(tmp: Path, floor: float | None) -> Path:
    bands = bands_of(shipped_cuts())
    models = vllm_quality_models() if floor is not None else None
    (tmp / "routes.yaml").write_text(routes_yaml({t: [(f"{t}-a", "http://127.0.0.1:9/v1")] for t in TIERS},
                                                 quality_models=models))
    (tmp / "policy.yaml").write_text(policy_yaml(TIERS[0], [{"name": "plain", "key": PLAIN_KEY},
                                                            routed_tenant(CLASSIFIER, bands, floor)], max_tokens=1))
    return tmp


@pytest.mark.parametrize("floor", [None, 0.008])
def test_the_bench_configs_load_and_route_as_asked(tmp_path: Path, floor: float | None) -> None:
    config = load_config(write(tmp_path, floor) / "routes.yaml", tmp_path / "policy.yaml")
    tenants = {t.name: t for t in config.tenants_by_key_hash.values()}
    routed, plain = tenants["routed"], tenants["plain"]
    assert routed.quality_floor == floor and routed.routing is not None  # the bands stay, as in policies/local.yaml
    assert plain.quality_floor is None and plain.routing is None
    assert routes_by_quality(tenants.values()) is (floor is not None)
    measured = [t.quality_model for t in config.routes.tiers]
    assert measured == (list(vllm_quality_models().values()) if floor is not None else [None] * len(TIERS))
    listed = yaml.safe_load((tmp_path / "policy.yaml").read_text())["tenants"]
    assert all("key" not in t and len(t["api_key_sha256"]) == 64 for t in listed)
    assert listed[0]["api_key_sha256"] == key_sha256(PLAIN_KEY)


def test_route_kinds_and_mismatches() -> None:
    assert route_kind("quality: small-int4 (0.412) is the cheapest within floor 0.008 of the best") == "quality"
    assert route_kind("band: difficulty 0.0123 -> small-int4") == "band"
    assert route_kind("default tier: the tenant routes by neither quality_floor nor bands") == "default tier"
    assert route_kind(None) == "-"
    assert [expected_route(m, True) for m in ("OFF", "ON cold", "ON warm")] == ["default tier", "quality", "quality"]
    assert [expected_route(m, False) for m in ("OFF", "ON cold", "ON warm")] == ["default tier", "band", "band"]
    rows = [{"mode": "OFF", "concurrency": 16, "n": 4, "routes": {"default tier": 4}},
            {"mode": "ON cold", "concurrency": 16, "n": 4, "routes": {"quality": 3, "band": 1}},
            {"mode": "ON warm", "concurrency": 1, "n": 2, "routes": {"quality": 2}}]
    assert route_mismatches(rows, by_quality=True) == ["ON cold c=16: {'band': 1} of 4 did not route by quality"]
    assert len(route_mismatches(rows, by_quality=False)) == 2
