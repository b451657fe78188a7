"""The difficulty head: the built ONNX graph served == numpy logistic, input checks, and the Newton fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.head import FEATURES, HeadSession, log_chars
from gateway.training.fit import build_head_onnx, fit_head


def numpy_head(w: np.ndarray, b: float, mean: np.ndarray, std: np.ndarray, emb: np.ndarray, lc: np.ndarray) -> np.ndarray:
    x = np.hstack([emb.astype(np.float64), lc.reshape(-1, 1).astype(np.float64)])
    return 1.0 / (1.0 + np.exp(-(((x - mean) / std) @ w + b)))


def test_onnx_head_equals_numpy_logistic_on_random_inputs(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    w, b = rng.normal(0, 0.5, FEATURES), 0.3
    mean, std = rng.normal(0, 0.05, FEATURES), rng.uniform(0.02, 2.0, FEATURES)
    path = tmp_path / "head.onnx"
    path.write_bytes(build_head_onnx(w, b, mean, std, {"encoder_variant": "int8"}))
    session = HeadSession(path)
    assert session.metadata["encoder_variant"] == "int8"
    for batch in (1, 5, 64):
        emb = rng.normal(0, 0.05, (batch, 384)).astype(np.float32)
        lc = rng.uniform(0, 10, batch).astype(np.float32)
        got = session.score(emb, lc.reshape(-1, 1))
        assert got.shape == (batch,) and got.dtype == np.float32
        np.testing.assert_allclose(got, numpy_head(w, b, mean, std, emb, lc), rtol=0, atol=2e-6)
    one = session.score(emb[0], lc[:1])  # a single (384,) row is accepted
    np.testing.assert_allclose(one, got[:1], atol=1e-7)


def test_build_and_score_reject_wrong_shapes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="385"):
        build_head_onnx(np.zeros(384), 0.0, np.zeros(FEATURES), np.ones(FEATURES))
    with pytest.raises(ValueError, match="positive"):
        build_head_onnx(np.zeros(FEATURES), 0.0, np.zeros(FEATURES), np.zeros(FEATURES))
    path = tmp_path / "head.onnx"
    path.write_bytes(build_head_onnx(np.zeros(FEATURES), 0.0, np.zeros(FEATURES), np.ones(FEATURES)))
    with pytest.raises(ValueError, match="384"):
        HeadSession(path).score(np.zeros((2, 10), dtype=np.float32), [1.0, 2.0])


def test_log_chars_is_log1p_of_the_character_count() -> None:
    np.testing.assert_allclose(log_chars(["", "abc", "é" * 99]).ravel(), np.log1p([0, 3, 99]), rtol=1e-6)


def test_fit_recovers_the_weights_of_soft_labels_and_onnx_matches_predict(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (3000, FEATURES))
    true_w = np.zeros(FEATURES)
    true_w[:5] = [1.5, -2.0, 0.7, 0.0, 1.0]
    true_w[-1] = -0.8
    y = 1.0 / (1.0 + np.exp(-(x @ true_w + 0.25)))  # soft targets: the optimum is exactly true_w
    head, iterations = fit_head(x, y, 1e-8)
    assert iterations < 30
    np.testing.assert_allclose(head.weights / head.std, true_w, atol=2e-3)
    onnx_path = tmp_path / "fit.onnx"
    onnx_path.write_bytes(head.to_onnx())
    got = HeadSession(onnx_path).score(x[:50, :384], x[:50, 384])
    np.testing.assert_allclose(got, head.predict(x[:50]), atol=2e-6)


def test_stronger_l2_shrinks_the_weights_and_the_fit_is_deterministic() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (400, FEATURES))
    y = (x[:, 0] + rng.normal(0, 1, 400) > 0).astype(float)
    weak, _ = fit_head(x, y, 0.01)
    strong, _ = fit_head(x, y, 10.0)
    assert np.linalg.norm(strong.weights) < 0.2 * np.linalg.norm(weak.weights)
    again, _ = fit_head(x, y, 0.01)
    assert np.array_equal(weak.weights, again.weights) and weak.bias == again.bias
    length_only, _ = fit_head(x, y, 0.01, standardize="length")
    assert np.all(length_only.std[:-1] == 1.0) and np.all(length_only.mean[:-1] == 0.0)
