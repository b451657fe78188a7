"""The gateway's shadow pairs and feedback as outcome rows, and `gateway train --from-outcomes` / `--help`."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.training import router_train
from gateway.training.outcomes import OutcomeRow
from gateway.training.traffic_outcomes import read_mixed

MODELS = {"small": "m7b", "large": "m51b"}


def pair(request_id: str, prompt: str, agreement: float | None, judge: float | None = None) -> dict[str, Any]:
    return {"ts": "2026-11-27T10:00:00.000+00:00", "request_id": request_id, "tenant": "demo", "experiment": None,
            "arm": None, "from_tier": "small", "to_tier": "large", "prompt": prompt, "answer": "a", "reference": "b",
            "agreement": agreement, "judge_tier": None, "judge_score": judge, "shadow_cost_usd": 0.0001}


def feedback(request_id: str, tier: str, score: float, **extra: Any) -> dict[str, Any]:
    return {"ts": "2026-11-27T10:00:01.000+00:00", "request_id": request_id, "tenant": "demo", "experiment": None,
            "arm": None, "tier": tier, "score": score, "source": "score", "comment": False, "event": "feedback",
            "level": "info", **extra}


def jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_pairs_feedback_and_public_rows_become_outcome_rows(tmp_path: Path) -> None:
    pairs = jsonl(tmp_path / "pairs.jsonl", [pair("r1", "What is 2+2?", 0.9), pair("r2", "Prove it", 0.3, judge=0.2),
                                             pair("r3", "No signal", None), "{torn"])
    log = jsonl(tmp_path / "requests.log", [
        {"event": "request", "request_id": "r1", "tier": "small", "status": 200},
        feedback("r1", "small", 1.0), feedback("r9", "large", 0.0),  # r9: no pair, no prompt
        feedback("r8", "large", 0.5, prompt="An exported prompt"),
    ])
    public = jsonl(tmp_path / "outcomes.jsonl", [{"id": "p1", "prompt": "Q?", "scores": {"m7b": 0.0, "m51b": 1.0}}])
    rows, counts = read_mixed([pairs, log, public], MODELS)
    by_prompt = {r.prompt: r for r in rows}
    assert (counts.outcome_rows, counts.shadow_pairs, counts.feedback) == (1, 2, 2)
    assert (counts.feedback_without_prompt, counts.without_signal, counts.malformed, counts.other) == (1, 1, 1, 1)
    # the pair's agreement and the feedback on the same request, averaged for the small tier's model
    assert by_prompt["What is 2+2?"].scores == {"m7b": pytest.approx(0.95), "m51b": 1.0}
    assert by_prompt["What is 2+2?"].source == "feedback+shadow" and by_prompt["What is 2+2?"].task == "demo"
    assert by_prompt["Prove it"].scores == {"m7b": 0.2, "m51b": 1.0}  # the judge's grade before the agreement
    assert by_prompt["An exported prompt"].scores == {"m51b": 0.5}
    assert by_prompt["Q?"].id == "p1" and all(r.split in ("train", "heldout") for r in rows)


def test_a_rotated_gzip_log_is_read(tmp_path: Path) -> None:
    pairs = jsonl(tmp_path / "pairs.jsonl", [json.dumps(pair("r1", "What\u2028is 2+2?", 0.9), ensure_ascii=False)])
    log = tmp_path / "requests.log.1.gz"
    log.write_bytes(gzip.compress((json.dumps(feedback("r1", "large", 0.5)) + "\n").encode()))
    rows, counts = read_mixed([pairs, log], MODELS)
    assert counts.feedback == 1 and rows[0].prompt == "What\u2028is 2+2?"
    assert rows[0].scores == {"m7b": 0.9, "m51b": pytest.approx(0.75)}


def test_without_a_tier_map_the_tier_names_stand(tmp_path: Path) -> None:
    rows, _ = read_mixed([jsonl(tmp_path / "p.jsonl", [pair("r1", "x", 0.4)])])
    assert rows[0].scores == {"small": 0.4, "large": 1.0}


def test_a_bad_public_row_is_named(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "o.jsonl", [{"prompt": "x", "scores": {"m": 2.0}}])
    with pytest.raises(ValueError, match=r"o.jsonl:1: `scores.m` = 2.0 is outside \[0, 1\]"):
        read_mixed([path])


def test_train_help_lists_every_way_in(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--data" in text and "--from-shadow" in text and "--from-outcomes" in text and "/v1/feedback" in text


def test_train_from_outcomes_fits_the_router_on_every_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[list[OutcomeRow], Path]] = []

    def fake_train(rows: list[OutcomeRow], out: Path, **options: Any) -> dict[str, Any]:
        seen.append((rows, out))
        return {"models": ["m7b", "m51b"], "training": {"seconds": 0.1}}

    monkeypatch.setattr(router_train, "train_router", fake_train)
    routes = tmp_path / "routes.yaml"
    routes.write_text("""
tiers:
  - {name: small, precision: int4, context_window: 4096, prices: {input_per_mtok: 1, output_per_mtok: 2},
     quality_model: m7b, replicas: [{name: s, url: "http://127.0.0.1:1/v1", model: m}]}
  - {name: large, precision: fp16, context_window: 4096, prices: {input_per_mtok: 2, output_per_mtok: 8},
     quality_model: m51b, replicas: [{name: l, url: "http://127.0.0.1:1/v1", model: m}]}
""")
    pairs = jsonl(tmp_path / "pairs.jsonl", [pair("r1", "x", 0.4)])
    public = jsonl(tmp_path / "o.jsonl", [{"prompt": "Q?", "scores": {"m7b": 0.0, "m51b": 1.0}}])
    code = main(["train", "--from-outcomes", str(public), str(pairs), "--routes", str(routes),
                 "--out", str(tmp_path / "router")])
    assert code == 0, capsys.readouterr().err
    (rows, out), = seen
    assert out == tmp_path / "router" and [r.scores for r in rows] == [{"m7b": 0.0, "m51b": 1.0},
                                                                       {"m7b": 0.4, "m51b": 1.0}]
    printed = capsys.readouterr().out
    assert "1 outcome rows, 1 shadow pairs, 0 feedback" in printed and "fitted 2 model outputs" in printed
    assert main(["train", "--from-outcomes", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r")]) == 2


def test_one_feedback_per_request_counts_the_last_and_every_tenant_weighs_the_same(tmp_path: Path) -> None:
    """Issue 37: 100 posts on one request id were 100 labels (0.15 became 0.99), and one tenant's volume
    outweighed another's for the same prompt."""
    pairs = jsonl(tmp_path / "pairs.jsonl", [pair("r1", "Shared prompt", 0.15)])
    spam = [feedback("r1", "small", 1.0, ts=f"2026-11-27T10:00:{i + 2:02d}.000+00:00") for i in range(50)]
    spam.insert(10, feedback("r1", "small", 0.1, ts="2026-11-27T10:01:00.000+00:00"))  # the latest, read early
    many = [feedback(f"b{i}", "small", 0.0, tenant="bob", prompt="Shared prompt") for i in range(30)]
    log = jsonl(tmp_path / "requests.log", [*spam, *many])
    rows, counts = read_mixed([pairs, log], MODELS)
    (row,) = rows
    assert (counts.feedback, counts.feedback_replaced) == (31, 50)
    # demo: the pair (0.15) and its one feedback, the last by time (0.1): 0.125; bob: 0.0 however many
    assert row.scores == {"m7b": pytest.approx(0.0625), "m51b": 1.0}
