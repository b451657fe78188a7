"""Loading the quality predictor for `gateway serve | up | route explain`: only when a tenant or an arm routes
by quality_floor; a missing router or a tier model it does not know is said, never fatal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.routing import tools as route_tools
from gateway.testing import TableQualityPredictor, gateway_config, tier

ROOT = Path(__file__).resolve().parents[2]


def config(policy: dict[str, Any]) -> Any:
    tiers = [tier("small", ["http://127.0.0.1:1/v1"], quality_model="m7b"),
             tier("large", ["http://127.0.0.1:1/v1"], quality_model="m51b"),
             tier("odd", ["http://127.0.0.1:1/v1"], quality_model="nobody-measured-me")]
    return gateway_config(tiers, policy=policy)


def test_it_loads_only_when_a_tenant_or_an_arm_routes_by_quality(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake = TableQualityPredictor({}, default={"m7b": 0.5, "m51b": 0.6})
    loaded: list[Path] = []
    monkeypatch.setattr(route_tools, "load_predictor", lambda folder, scorer=None: loaded.append(folder) or fake)
    assert route_tools.serving_predictor(config({}), None) is None and loaded == []
    arms = [{"name": "floor", "share": 0.5, "quality_floor": 0.05}]
    assert route_tools.serving_predictor(config({"experiments": [{"name": "x", "arms": arms}]}), None) is fake
    assert route_tools.serving_predictor(config({"quality_floor": 0.05}), None) is fake
    assert [folder.resolve() for folder in loaded] == [ROOT / "models" / "router"] * 2
    err = capsys.readouterr().err
    assert "routes: tiers[2].quality_model: 'nobody-measured-me' is not a model the quality predictor knows" in err


def test_a_missing_router_leaves_the_bands_in_charge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config({"quality_floor": 0.05, "quality_predictor": str(tmp_path / "no-router")})
    assert route_tools.serving_predictor(cfg, None) is None
    err = capsys.readouterr().err
    assert f"quality predictor {tmp_path / 'no-router'} not loaded" in err and "route by their bands" in err


def test_route_explain_on_the_shipped_files_loads_the_router() -> None:
    argv = ["route", "explain", "--routes", str(ROOT / "routes/local.yaml"), "--policies",
            str(ROOT / "policies/local.yaml"), "--tenant", "demo", "--prompt", "hi"]
    run = subprocess.run([sys.executable, "-m", "gateway", *argv], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "quality predictor" in run.stderr
    lines = run.stdout.splitlines()
    assert any(line.strip().startswith("quality small-q4:") and "(chosen)" in line for line in lines)
    assert "tier: small-q4" in run.stdout
