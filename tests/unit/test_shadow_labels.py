"""`gateway train --from-shadow`: pairs to labels (the cut, the signal, the split by prompt), the paired comparison
of two heads, and the whole command on pairs whose agreement follows the rubric level (the shipped encoder)."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.classifier.difficulty import load_classifier
from gateway.cli import main
from gateway.training.shadow_labels import (
    PairCounts, ShadowLabel, check_split, compare_heads, fit_head_on, label_pairs, read_pairs,
)

ROOT = Path(__file__).resolve().parents[2]


def pair(prompt: str, agreement: float | None, judge: float | None = None, **extra: Any) -> dict[str, Any]:
    return {"request_id": prompt, "tenant": "t", "from_tier": "small", "to_tier": "large", "prompt": prompt,
            "answer": "a", "reference": "b", "agreement": agreement, "judge_score": judge, **extra}


def test_low_agreement_is_hard_and_a_repeated_prompt_stays_on_one_side(tmp_path: Path) -> None:
    rows = [pair("p1", 0.5), pair("p2", 0.9), pair("p1", 0.95), pair("p3", None, judge=0.2), pair("p4", True)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"torn', encoding="utf-8")
    counts = PairCounts()
    read = read_pairs([path], counts)
    assert (counts.read, counts.malformed, len(read)) == (6, 1, 5)
    labels = label_pairs(read, "agreement", 0.75, 0.5, counts)
    assert [(label.prompt, label.hard) for label in labels] == [("p1", 1.0), ("p2", 0.0), ("p1", 0.0)]
    assert labels[0].split == labels[2].split and counts.no_signal == 2 and counts.routes == {"small -> large": 3}
    judged = label_pairs(read, "judge", 0.6, 0.5, PairCounts())
    assert [(label.prompt, label.hard) for label in judged] == [("p3", 1.0)]
    with pytest.raises(ValueError, match="train has 3 pairs"):
        check_split([ShadowLabel("k", "p", 1.0, 0.5, "train")] * 3)


def test_the_comparison_is_paired_and_says_which_head_ranks_better() -> None:
    rng = np.random.default_rng(0)
    hard = (rng.random(300) < 0.3).astype(np.float64)
    perfect, noise = hard + rng.random(300) * 0.5, rng.random(300)
    better = compare_heads(perfect, noise, hard, n_boot=200)
    assert better["verdict"] == "better" and better["new_auc"] == 1.0 and better["diff_ci"][0] > 0.3
    assert compare_heads(noise, perfect, hard, n_boot=200)["verdict"] == "worse"
    assert compare_heads(noise, noise, hard, n_boot=200)["verdict"] == "inconclusive"


def test_train_from_shadow_writes_a_head_the_gateway_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [json.loads(line) for line in (ROOT / "models/difficulty/labels/rubric.jsonl").open(encoding="utf-8")]
    held = sorted((r for r in rows if r["split"] == "heldout"), key=lambda r: len(r["prompt"]))  # never seen
    hard, easy = [r for r in held if r["level"] >= 4][:30], [r for r in held if r["level"] <= 2][:60]
    rng = random.Random(0)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(pair(r["prompt"], rng.uniform(0.3, 0.7) if r in hard else
                                             rng.uniform(0.8, 0.98))) + "\n" for r in hard + easy), encoding="utf-8")
    out = tmp_path / "head"
    assert main(["train", "--from-shadow", str(pairs), "--out", str(out), "--bootstrap", "200", "--l2", "1"]) == 0
    printed = capsys.readouterr().out
    assert "new head:     held-out AUC" in printed and "shipped head: held-out AUC" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    shadow = metrics["shadow"]
    assert metrics["counts"]["pairs_used"] == 90 and shadow["signal"] == "agreement" and shadow["cut"] == 0.75
    assert shadow["verdict"] in ("better", "worse", "inconclusive") and 0.5 < shadow["new_auc"] <= 1.0
    assert shadow["n"] == metrics["counts"]["heldout"] == metrics["heldout"]["n"]
    classifier = load_classifier(out)
    try:
        assert 0.0 <= asyncio.run(classifier.score("Prove the Riemann hypothesis.")) <= 1.0
    finally:
        classifier.close()
    assert main(["train", "--from-shadow", str(tmp_path / "missing.jsonl")]) == 2


def test_a_head_fitted_on_few_noisy_pairs_is_never_flipped_by_platt_scaling() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(60, 385)), (rng.random(60) < 0.3).astype(np.float64)
    keys = [str(i) for i in range(60)]
    for seed in range(3):  # pure noise: the out-of-fold scores rank the labels backwards about half the time
        fitted = fit_head_on(x, y, keys, seed=seed)
        assert fitted.platt is None or fitted.platt[0] > 0
