"""`gateway route score IN.jsonl OUT.jsonl`: each prompt's predicted quality per tier and its gain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.routing import tools as route_tools
from gateway.cli import main
from gateway.testing import TableQualityPredictor

ROUTES = """
tiers:
  - name: small
    precision: int4
    context_window: 4096
    prices: {input_per_mtok: 1.0, output_per_mtok: 2.0}
    quality_model: m7b
    replicas: [{name: small-a, url: "http://127.0.0.1:1/v1", model: m}]
  - name: large
    precision: fp16
    context_window: 4096
    prices: {input_per_mtok: 2.0, output_per_mtok: 8.0}
    quality_model: m51b
    replicas: [{name: large-a, url: "http://127.0.0.1:1/v1", model: m}]
  - name: unmeasured
    precision: int8
    context_window: 4096
    prices: {input_per_mtok: 0.1, output_per_mtok: 0.1}
    replicas: [{name: u-a, url: "http://127.0.0.1:1/v1", model: m}]
"""
TABLE = {"hi": {"m7b": 0.9, "m51b": 0.92}, "prove it": {"m7b": 0.2, "m51b": 0.7}}


@pytest.fixture
def predictor(monkeypatch: pytest.MonkeyPatch) -> TableQualityPredictor:
    fake = TableQualityPredictor(TABLE, default={"m7b": 0.5, "m51b": 0.5})
    monkeypatch.setattr(route_tools, "load_predictor", lambda folder, scorer=None: fake)
    return fake


def test_each_prompt_gets_each_tiers_quality_and_the_gain(tmp_path: Path, predictor: TableQualityPredictor) -> None:
    routes, prompts, out = tmp_path / "routes.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    routes.write_text(ROUTES)
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": 7, "prompt": "prove it"}\n\n{"prompt": "other"}\n')
    assert main(["route", "score", str(prompts), str(out), "--routes", str(routes)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", 7, 4]  # a missing id: the line number
    assert rows[0]["quality"] == {"small": 0.9, "large": 0.92} and rows[0]["gain"] == pytest.approx(0.02)
    assert rows[1]["gain"] == pytest.approx(0.5) and rows[2]["gain"] == pytest.approx(0.0)
    assert predictor.closed


def test_a_bad_line_is_named_and_nothing_is_written(tmp_path: Path, predictor: TableQualityPredictor,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    routes, prompts, out = tmp_path / "routes.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    routes.write_text(ROUTES)
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "text": "no prompt"}\n')
    assert main(["route", "score", str(prompts), str(out), "--routes", str(routes)]) == 2
    assert f"{prompts}:2: a line needs a string `prompt`" in capsys.readouterr().err and not out.exists()


def test_fewer_than_two_measured_tiers_is_refused(tmp_path: Path, predictor: TableQualityPredictor,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    routes, prompts, out = tmp_path / "routes.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    routes.write_text(ROUTES.replace("quality_model: m51b", "quality_model: unknown-model"))
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    assert main(["route", "score", str(prompts), str(out), "--routes", str(routes)]) == 2
    err = capsys.readouterr().err
    assert "tiers[1].quality_model: 'unknown-model' is not a model the quality predictor knows" in err
    assert "the gain needs two" in err


def test_a_missing_predictor_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    routes, prompts = tmp_path / "routes.yaml", tmp_path / "in.jsonl"
    routes.write_text(ROUTES)
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    code = main(["route", "score", str(prompts), str(tmp_path / "o.jsonl"), "--routes", str(routes),
                 "--predictor", str(tmp_path / "nowhere")])
    assert code == 2 and "gateway route score: " in capsys.readouterr().err


def test_floors_print_each_floors_tier_shares_and_quality_kept(tmp_path: Path, predictor: TableQualityPredictor,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    routes, prompts, out = tmp_path / "routes.yaml", tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    routes.write_text(ROUTES)
    prompts.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "prove it"}\n')
    assert main(["route", "score", str(prompts), str(out), "--routes", str(routes), "--floors", "0,0.6"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "2 prompts: mean predicted quality 0.5500 all on the cheapest tier, 0.8100 all on the dearest"
    # floor 0: each prompt on its best tier (large for both); floor 0.6: both within it of the best, on small
    assert printed[1] == "floor 0: large 100.0%; mean predicted quality 0.8100 (100.0% of the dearest tier's gain kept)"
    assert printed[2] == "floor 0.6: small 100.0%; mean predicted quality 0.5500 (0.0% of the dearest tier's gain kept)"
    with pytest.raises(SystemExit) as bad:
        main(["route", "score", str(prompts), str(out), "--floors", "2"])
    assert bad.value.code == 2 and "floors are in [0, 1]" in capsys.readouterr().err
