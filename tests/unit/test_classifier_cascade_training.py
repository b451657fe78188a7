"""Fitting the cascade (gateway.training.cascade) and `gateway train` writing, or removing, cascade.json."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.cascade import CASCADE_FILE, Cascade, load_word_table, static_features
from gateway.classifier.difficulty import file_sha256, load_classifier
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.cascade import cell_quantiles, fit_cascade, logit, ridge, token_edges
from gateway.training.train import run_train


def test_ridge_recovers_a_linear_target_on_raw_features() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, [1.0, 10.0, 0.1], (500, 3))
    y = x @ np.array([0.5, -0.2, 4.0]) + 1.5
    w, b = ridge(x, y, 1e-9)
    np.testing.assert_allclose(w, [0.5, -0.2, 4.0], atol=1e-5)
    assert b == pytest.approx(1.5, abs=1e-4)


def test_cell_quantiles_fall_back_for_thin_cells() -> None:
    rng = np.random.default_rng(1)
    residual = np.r_[rng.normal(0, 1, 400), rng.normal(0, 3, 10)]
    bucket = np.r_[np.zeros(400, int), np.ones(10, int)]
    bins = np.r_[np.arange(400) % 2, np.zeros(10, int)]
    lo, mid, hi = cell_quantiles(residual, bucket, bins, (2, 2), 0.9)
    assert lo.shape == (2, 2) and np.all(lo < mid) and np.all(mid < hi)
    assert hi[0, 0] == pytest.approx(np.quantile(residual[:400][bins[:400] == 0], 0.95))
    assert hi[1, 0] == hi[1, 1] == pytest.approx(np.quantile(residual, 0.95))  # a thin bucket: all rows


def test_token_edges_end_at_the_window() -> None:
    assert token_edges(64) == (16, 32, 64) and token_edges(256) == (16, 32, 64, 128, 256) and token_edges(8) == (8,)


def test_the_fitted_cascade_imitates_a_full_score_it_can_see() -> None:
    """A 'full model' that is a function of the static features themselves: the cascade learns it and, at
    cuts far from most scores, decides most prompts, agreeing with the full model on the bands."""
    table = load_word_table()
    tok = PromptTokenizer(64)
    words = ["proof", "theorem", "kernel", "distributed", "hello", "thanks", "cat", "morning", "recipe", "poem",
             "lemma", "consensus", "invariant", "party", "sunny", "weekend"]
    rnd = random.Random(3)
    prompts = [" ".join(rnd.choice(words) for _ in range(rnd.randint(2, 30))) for _ in range(900)]
    ids = [tok.ids(p) for p in prompts]
    x = np.stack([static_features(table.vectors, i, len(p)) for i, p in zip(ids, prompts)])
    direction = np.random.default_rng(2).normal(0, 1, x.shape[1])
    z = (x - x.mean(axis=0)) @ direction
    z = 2.0 * (z - z.mean()) / z.std() - 3.0
    full = 1 / (1 + np.exp(-z))
    train = np.arange(len(prompts)) % 5 != 0
    folds = np.arange(int(train.sum())) % 5
    cuts = [0.001, 0.5]  # logits -6.9 and 0: most scores (logit -3 +- 2) are far from both
    fit = fit_cascade(ids, [len(p) for p in prompts], full, train, folds, table=table, max_tokens=64,
                      head_sha256="0" * 64, coverage=0.95, cuts=cuts)
    assert fit.validation["oof_rmse"] < 0.2
    assert fit.heldout["decided_share"] > 0.8 and fit.heldout["band_agreement"] >= 0.99
    cascade = Cascade(fit.model, table)
    cascade.use_cuts(cuts)
    held = [i for i in range(len(prompts)) if not train[i]]
    decided = [(cascade.decide(ids[i], len(prompts[i])), full[i]) for i in held]
    errors = [abs(logit([d])[0] - logit([f])[0]) for d, f in decided if d is not None]
    assert np.median(errors) < 0.2


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def synthetic_rows(n: int) -> list[dict[str, object]]:
    rnd = random.Random(5)
    rows: list[dict[str, object]] = []
    for i in range(n):
        if i % 2:
            prompt = f"Prove that the algorithm {rnd.choice(['A', 'B', 'C'])} terminates and bound its running time ({i})."
            label = rnd.uniform(0.75, 1.0)
        else:
            prompt, label = f"{rnd.choice(['hi', 'hello', 'thanks'])} {rnd.choice(['Ana', 'Bo', 'Chen'])} {i}", rnd.uniform(0, 0.3)
        rows.append({"id": f"s{i}_0", "prompt": prompt, "label": round(label, 4), "language": "en"})
    return rows


async def test_gateway_train_writes_a_cascade_the_gateway_loads(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "synthetic.jsonl", synthetic_rows(120))
    args = ["--data", str(data), "--heldout-share", "0.3", "--val-folds", "3", "--threads", "1", "--max-tokens", "32",
            "--hard-at", "0.75", "--target", "hard", "--embed-cache", str(tmp_path / "cache"), "--out", str(tmp_path / "m")]
    assert run_train(args) == 0
    model = tmp_path / "m"
    metrics = json.loads((model / "metrics.json").read_text())
    cascade = json.loads((model / CASCADE_FILE).read_text())
    assert metrics["encoder"]["max_tokens"] == 32 and cascade["max_tokens"] == 32
    assert cascade["head_sha256"] == file_sha256(model / "head.onnx")
    assert metrics["cascade"]["heldout"]["n"] == metrics["counts"]["heldout"]
    assert list((tmp_path / "cache").glob("*.t32.npz"))  # the 32-token embeddings, apart from 256-token ones
    clf = load_classifier(model, providers=["CPUExecutionProvider"], cuts=[0.5])
    assert clf.cascade is not None and clf.tokenizer is not None and clf.tokenizer.max_tokens == 32
    assert 0.0 <= await clf.score("hello Bo 2") <= 1.0
    clf.close()
    assert run_train([*args, "--no-cascade"]) == 0  # a cascade for the old head must not stay behind
    assert not (model / CASCADE_FILE).exists() and "cascade" not in json.loads((model / "metrics.json").read_text())
    assert load_classifier(model, providers=["CPUExecutionProvider"]).cascade is None
