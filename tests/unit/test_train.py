"""`gateway train`: label parsing, splits, and an end-to-end fit on separable synthetic prompts."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.encoder import DIFFICULTY, EncoderSession, default_model_path
from gateway.classifier.head import HeadSession, log_chars
from gateway.training.train import L2_GRID, fit_target, hash_split, load_labeled, platt, row_label, run_train


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_winner_labels_parse(tmp_path: Path) -> None:
    assert [row_label({"winner": w}, "x") for w in ("strong", "weak", "tie", "tie (bothbad)", "Strong")] == [
        1.0, 0.0, 0.5, 0.5, 1.0,
    ]
    rows, source = load_labeled(write_jsonl(tmp_path / "r.jsonl", [
        {"prompt": "a", "winner": "strong"}, {"prompt": "b", "winner": "weak"}, {"prompt": "c", "winner": "tie"},
    ]))
    assert [r.label for r in rows] == [1.0, 0.0, 0.5] and source == "winner"
    with pytest.raises(ValueError, match="r.jsonl:1: winner 'model_a'"):
        row_label({"winner": "model_a"}, "r.jsonl:1")
    with pytest.raises(ValueError, match="outside"):
        row_label({"label": 1.5}, "x")


def test_rows_use_their_split_else_a_stable_hash_split(tmp_path: Path) -> None:
    rows, source = load_labeled(write_jsonl(tmp_path / "r.jsonl", [
        {"id": "a_0", "prompt": "p1", "label": 0.2, "split": "heldout", "language": "en"},
        {"id": "a_1", "prompt": "p2", "label": 0.9},
    ]))
    assert source == "label" and rows[0].split == "heldout"
    assert rows[1].split == hash_split("a_0", 0.2)  # parts of one conversation stay together
    shares = [hash_split(f"conv{i}_0", 0.2) == "heldout" for i in range(2000)]
    assert 0.17 < np.mean(shares) < 0.23
    assert [hash_split(f"c{i}", 0.2) for i in range(50)] == [hash_split(f"c{i}", 0.2) for i in range(50)]


def test_unfinalized_labeling_output_gets_rank_labels_and_odd_line_breaks_survive(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "nll.jsonl", [
        {"id": "x_0", "prompt": "요약해줘\u2028- 저자\u2028- 제목", "nll": 3.0, "language": "ko"},
        {"id": "y_0", "prompt": "hi\x85there", "nll": 1.0, "language": "en"},
        {"id": "z_0", "prompt": "three", "nll": 2.0, "language": "en"},
    ])
    with path.open("a", encoding="utf-8") as f:
        f.write('{"id": "torn", "prompt": "half a li')  # a file still being written
    rows, source = load_labeled(path)
    assert source == "nll-rank" and [r.label for r in rows] == [1.0, 0.0, 0.5]
    assert rows[0].prompt.count("\u2028") == 2


def synthetic_rows(n: int) -> list[dict[str, object]]:
    """Short greetings (easy) vs long code requests (hard), labels jittered."""
    rnd = random.Random(5)
    greet = ["hi", "hello", "hey there", "good morning", "thanks!", "how are you?", "yo", "good night", "cheers"]
    names = ["Ana", "Bo", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun"]
    tasks = ["a thread-safe LRU cache", "Dijkstra's algorithm on a sparse graph", "a B-tree with deletion",
             "a lock-free queue", "an interval tree", "a regex engine with backtracking", "a Raft log"]
    langs = ["Rust", "C++", "Python", "Go", "Haskell"]
    rows: list[dict[str, object]] = []
    for i in range(n):
        if i % 2:
            prompt = (f"Implement {rnd.choice(tasks)} in {rnd.choice(langs)}. Include unit tests, handle edge "
                      f"cases, and explain the time and memory complexity of every operation (variant {i}).")
            label = rnd.uniform(0.65, 1.0)
        else:
            prompt, label = f"{rnd.choice(greet)} {rnd.choice(names)}", rnd.uniform(0.0, 0.35)
        rows.append({"id": f"s{i}_0", "prompt": prompt, "label": round(label, 4), "language": "en"})
    return rows


def test_training_on_separable_prompts_reaches_high_auc_and_writes_all_artifacts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_jsonl(tmp_path / "synthetic.jsonl", synthetic_rows(90))
    args = ["--data", str(data), "--heldout-share", "0.3", "--val-folds", "3", "--threads", "1",
            "--embed-cache", str(tmp_path / "cache")]
    assert run_train([*args, "--out", str(tmp_path / "m1")]) == 0
    out = capsys.readouterr()
    assert "heldout AUC" in out.out and "embed int8 [" in out.err
    m1 = tmp_path / "m1"
    metrics = json.loads((m1 / "metrics.json").read_text())
    assert metrics["heldout"]["auc"] >= 0.95 and metrics["heldout"]["brier"] < 0.15
    assert metrics["counts"]["train"] + metrics["counts"]["heldout"] == 90
    assert metrics["encoder"]["variant"] == "int8" and len(metrics["encoder"]["sha256"]) == 64
    assert len(metrics["training"]["l2_search"]) == len(L2_GRID) and metrics["per_language"]["en"]["n"] >= 20
    quantiles = list(json.loads((m1 / "thresholds.json").read_text())["quantiles"].values())
    assert len(quantiles) == 101 and quantiles == sorted(quantiles)
    assert (m1 / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    session = HeadSession(m1 / "head.onnx")
    assert session.metadata["encoder_sha256"] == metrics["encoder"]["sha256"]
    texts = ["hey there Bo", "Implement a lock-free queue in Rust. Include unit tests and explain complexity."]
    assert metrics["encoder"]["graph"] == "difficulty" and metrics["encoder"]["file"] == "difficulty.int8.onnx"
    easy, hard = session.score(EncoderSession(default_model_path("int8", DIFFICULTY)).embed(texts), log_chars(texts))
    assert easy < 0.5 < hard
    assert run_train([*args, "--out", str(tmp_path / "m2")]) == 0  # same seed -> same head, byte for byte
    assert (tmp_path / "m2" / "head.onnx").read_bytes() == (m1 / "head.onnx").read_bytes()
    encoders = tmp_path / "encoders"  # the int8 file under both names: "fp32" must come out compatible
    encoders.mkdir()
    for name in ("difficulty.int8.onnx", "difficulty.fp32.onnx"):
        (encoders / name).symlink_to(default_model_path("int8", DIFFICULTY))
    more = ["--calibration", "none", "--eval-variants", "fp32", "--encoder-dir", str(encoders)]
    assert run_train([*args, "--out", str(tmp_path / "m3"), *more]) == 0
    raw = json.loads((tmp_path / "m3" / "metrics.json").read_text())
    assert raw["training"]["platt"] is None and metrics["training"]["platt"][0] > 0
    assert raw["heldout"]["auc"] == metrics["heldout"]["auc"]  # Platt scaling keeps the ranking
    fp32 = raw["compatible_encoders"]["fp32"]
    assert fp32["compatible"] and fp32["heldout_auc"] == raw["heldout"]["auc"] and fp32["max_abs_score_diff"] == 0


def test_platt_recovers_a_known_recalibration() -> None:
    rng = np.random.default_rng(2)
    t = rng.normal(0, 1.5, 20000)
    hard = rng.uniform(size=t.size) < 1 / (1 + np.exp(-(2.0 * t + 0.5)))
    a, c = platt(1 / (1 + np.exp(-t)), hard)
    assert a == pytest.approx(2.0, abs=0.15) and c == pytest.approx(0.5, abs=0.1)


def test_bad_input_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a"}, {"prompt": "b", "label": 0.3}])
    assert run_train(["--data", str(data), "--out", str(tmp_path / "m")]) == 2
    assert "rows [1] have no label" in capsys.readouterr().err


def test_the_hard_target_binarizes_at_the_hard_cut_and_metrics_use_it(tmp_path: Path) -> None:
    levels = np.array([0.0, 0.25, 0.5, 0.75, 1.0])  # rubric levels 1..5
    hard = argparse.Namespace(target="hard", hard_at=0.75)
    assert fit_target(levels, hard).tolist() == [0, 0, 0, 1, 1]
    assert fit_target(levels, argparse.Namespace(target="label", hard_at=0.75)).tolist() == levels.tolist()
    data = write_jsonl(tmp_path / "synthetic.jsonl", synthetic_rows(60))
    args = ["--data", str(data), "--heldout-share", "0.3", "--val-folds", "3", "--threads", "1", "--out",
            str(tmp_path / "m"), "--hard-at", "0.75", "--target", "hard", "--embed-cache", str(tmp_path / "cache")]
    assert run_train(args) == 0
    metrics = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert metrics["hard_at"] == 0.75 and metrics["heldout"]["hard_at"] == 0.75
    assert metrics["training"]["target"] == "hard" and set(metrics["heldout"]["auc_by_cut"]) == {"0.5", "0.75", "1"}
