"""`gateway calibrate`: N-tier quantile cuts hit the target shares; metrics; the printed policy YAML."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from gateway.classifier.difficulty import file_sha256
from gateway.classifier.encoder import default_model_path
from gateway.classifier.head import FEATURES
from gateway.config.policies import Routing
from gateway.training.calibrate import achieved_shares, cut_points, parse_targets, printable, run_calibrate
from gateway.training.fit import build_head_onnx
from gateway.training.quality import auc


@pytest.mark.parametrize("n", [1000, 997, 40])
@pytest.mark.parametrize("shares", [[0.6, 0.25, 0.15], [0.5, 0.5], [0.1, 0.2, 0.3, 0.4]])
def test_cuts_hit_the_target_shares_within_one_over_n(n: int, shares: list[float]) -> None:
    rng = np.random.default_rng(n)
    for scores in (rng.uniform(0, 1, n), rng.beta(8, 8, n).astype(np.float32)):  # float32 like the head
        cuts = printable(cut_points(scores, shares))
        assert cuts == sorted(set(cuts)) and 0 < cuts[0] and cuts[-1] <= 1
        got = achieved_shares(scores, cuts)
        assert sum(got) == pytest.approx(1.0)
        assert max(abs(g - s) for g, s in zip(got, shares, strict=True)) <= 1 / n + 1e-12
        routing = Routing(bands=tuple({"tier": f"t{i}", "below": c} for i, c in enumerate(cuts)) + ({"tier": "last"},))
        tiers = [routing.tier_for(float(s)) for s in scores]  # the gateway's own band lookup agrees
        assert tiers.count("t0") == round(got[0] * n)


def test_parse_targets() -> None:
    assert parse_targets("small=0.6, medium=0.25,large=0.15") == [("small", 0.6), ("medium", 0.25), ("large", 0.15)]
    for bad in ("small=0.6,large=0.3", "small=0.6", "small=x,large=0.4", "=0.5,b=0.5", "a=0,b=1"):
        with pytest.raises(ValueError, match="--target"):
            parse_targets(bad)


def test_auc_counts_ties_half_and_needs_both_classes() -> None:
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5
    assert auc([1.0, 2.0, 3.0], [1, 1, 1]) is None


def tiny_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    w = np.zeros(FEATURES)
    w[-1] = 1.0  # difficulty grows with the prompt's length: easy to check
    (model / "head.onnx").write_bytes(build_head_onnx(w, -4.0, np.zeros(FEATURES), np.ones(FEATURES)))
    encoder = {"variant": "int8", "file": "model.int8.onnx", "sha256": file_sha256(default_model_path("int8"))}
    (model / "metrics.json").write_text(json.dumps({"encoder": encoder}))
    return model


def test_run_calibrate_scores_a_file_and_prints_a_valid_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * (i * 7 + 1)}) + "\n" for i in range(40)))
    argv = ["--model", str(tiny_model(tmp_path)), "--sample", "40", "--data", str(data),
            "--target", "small=0.5,medium=0.3,large=0.2", "--tiers", "small-int4,medium-int8,large-fp16"]
    assert run_calibrate(argv) == 0
    out, err = capsys.readouterr()
    routing = Routing(**yaml.safe_load(out)["routing"])
    assert [b.tier for b in routing.bands] == ["small-int4", "medium-int8", "large-fp16"]
    assert routing.bands[-1].below is None
    match = re.search(r"small-int4=([\d.]+), medium-int8=([\d.]+), large-fp16=([\d.]+)", err)
    assert match is not None
    assert [float(g) for g in match.groups()] == pytest.approx([0.5, 0.3, 0.2], abs=1 / 40)


def test_run_calibrate_from_thresholds_json_and_bad_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    table = {f"{q:.2f}": round(0.2 + 0.5 * q, 6) for q in np.linspace(0, 1, 101)}
    (model / "thresholds.json").write_text(json.dumps({"quantiles": table}))
    assert run_calibrate(["--model", str(model), "--sample", "0", "--target", "a=0.6,b=0.4"]) == 0
    bands = yaml.safe_load(capsys.readouterr().out)["routing"]["bands"]
    assert bands == [{"below": 0.5, "tier": "a"}, {"tier": "b"}]
    assert run_calibrate(["--model", str(model), "--sample", "0", "--target", "a=0.6,b=0.3"]) == 2
    assert "sum to 1" in capsys.readouterr().err
