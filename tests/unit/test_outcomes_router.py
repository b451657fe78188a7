"""Fitting, exporting and serving the quality router (router_fit, router_train.export_router, classifier.quality)."""

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.difficulty import EncoderMismatch
from gateway.classifier.encoder import EMBEDDING_DIM
from gateway.classifier.prompt_features import COUNT, feature_matrix
from gateway.classifier.quality import QualityPredictor, load_quality_predictor, open_rubric
from gateway.classifier.quality_head import Neighbours, QualityHead, neighbour_means, rubric_gate
from gateway.training.router_fit import blend, fit_linear, knn_predict
from gateway.training.router_train import export_router

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(3)


def synthetic(n: int = 1500) -> tuple[np.ndarray, np.ndarray, list[str]]:
    texts = [("x" * int(RNG.integers(1, 400))) + (" 12 + 7 =" if i % 3 == 0 else "") for i in range(n)]
    emb = RNG.normal(size=(n, EMBEDDING_DIM)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    x = np.hstack([emb, feature_matrix(texts)]).astype(np.float64)
    p_small = 1 / (1 + np.exp(-(3 * emb[:, 0] * 10 - 1)))  # small fails where embedding[0] is low
    y = np.column_stack([(RNG.random(n) < p_small).astype(float), (RNG.random(n) < 0.9).astype(float)])
    y[: n // 4, 1] = np.nan  # the large model was not measured on a quarter of the rows
    return x, y, texts


def test_the_fit_learns_where_the_small_model_fails() -> None:
    x, y, _ = synthetic()
    router = fit_linear(x[:1200], y[:1200], ["small", "large"], 0.01)
    pred = router.predict(x[1200:])
    assert np.corrcoef(pred[:, 0], x[1200:, 0])[0, 1] > 0.5
    assert abs(float(pred[:, 1].mean()) - 0.9) < 0.1


def test_task_offsets_are_averaged_into_the_served_bias() -> None:
    x, y, _ = synthetic()
    groups = ["a" if i % 2 else "b" for i in range(len(x))]
    router = fit_linear(x, y, ["small", "large"], 1.0, groups=groups)
    assert abs(float(router.predict(x)[:, 1].mean()) - 0.9) < 0.1


def test_a_model_without_outcomes_is_refused() -> None:
    x, y, _ = synthetic()
    y[:, 1] = np.nan
    with pytest.raises(ValueError, match="'large' has 0 outcomes"):
        fit_linear(x, y, ["small", "large"], 1.0)


def test_knn_averages_the_nearest_measured_rows() -> None:
    emb = np.eye(4, dtype=np.float32)
    y = np.array([[1.0], [0.0], [np.nan], [1.0]])
    out = knn_predict(emb, y, emb[[0, 2]], k=1)
    assert out[0, 0] == 1.0 and out[1, 0] in (0.0, 1.0)


def test_export_then_serve_gives_the_fitted_numbers(tmp_path: Path) -> None:
    x, y, texts = synthetic()
    router = fit_linear(x, y, ["small", "large"], 1.0)
    metrics = (ROOT / "models" / "router" / "metrics.json").read_text()
    export_router(router, tmp_path, json.loads(metrics) | {"models": ["small", "large"]})
    head = QualityHead.load(tmp_path / "router.npz")
    assert head.models == ("small", "large")
    served = head.scores(x[:50, :EMBEDDING_DIM], texts[:50])
    assert np.allclose(served, router.predict(x[:50]), atol=2e-4)
    assert (tmp_path / "SHA256SUMS").read_text().count("  ") == 2


def test_arrays_that_do_not_fit_are_refused() -> None:
    width = EMBEDDING_DIM + COUNT
    ok = (np.zeros(width, np.float32), np.ones(width, np.float32), np.zeros((width, 2), np.float32), np.zeros(2, np.float32))
    QualityHead(["a", "b"], *ok)
    with pytest.raises(ValueError, match="do not fit"):
        QualityHead(["a"], *ok)
    with pytest.raises(ValueError, match="non-positive std"):
        QualityHead(["a", "b"], ok[0], ok[0], ok[2], ok[3])


class FakeEmbedder:
    namespace = "someone-else"

    def close(self) -> None:
        raise AssertionError("a shared embedder belongs to its owner")


def test_a_foreign_embedder_is_refused() -> None:
    with pytest.raises(EncoderMismatch, match="fitted on embeddings"):
        load_quality_predictor(ROOT / "models" / "router", embedder=FakeEmbedder())  # type: ignore[arg-type]


def test_the_shipped_router_serves_every_measured_model() -> None:
    predictor = load_quality_predictor(ROOT / "models" / "router")
    try:
        quality = asyncio.run(predictor.predict("What is 17 * 23? Answer with the number only."))
        both = asyncio.run(predictor.predict_many(["hi", "hi"]))
    finally:
        predictor.close()
    assert set(quality) == set(predictor.models) and len(predictor.models) >= 20
    assert all(0.0 <= q <= 1.0 for q in quality.values())
    assert both[0] == both[1] and isinstance(predictor, QualityPredictor)


def test_the_rubric_gate_shrinks_every_shortfall_with_p_hard() -> None:
    measured = np.array([[0.2, 0.9], [0.2, 0.9]])
    gated = rubric_gate(measured, [0.0, 1.0], 0.2)
    assert np.allclose(gated[0], [1.0, 1.0])  # trivial by the rubric: every model answers
    assert np.allclose(gated[1], 1 - (1 / 1.2) * (1 - measured[1]), atol=1e-6)
    assert np.array_equal(rubric_gate(measured, [0.0, 1.0], 0.0), measured.astype(np.float32))  # h0 = 0: no gate


def test_the_neighbour_table_survives_the_file_and_is_what_knn_computes(tmp_path: Path) -> None:
    x, y, texts = synthetic(300)
    emb = x[:, :EMBEDDING_DIM].astype(np.float32)
    router = fit_linear(x, y, ["small", "large"], 1.0)
    table = Neighbours(emb, y.astype(np.float32), 5, 0.25)
    export_router(router, tmp_path, {"models": ["small", "large"]}, 0.0, table)
    head = QualityHead.load(tmp_path / "router.npz")
    assert head.neighbours is not None and head.neighbours.k == 5 and head.neighbours.alpha == 0.25
    queries = emb[:20] + 0.01
    expected = blend(router.predict(np.hstack([queries, feature_matrix(texts[:20])])), knn_predict(emb, y, queries, 5), 0.25)
    assert np.allclose(head.measured(queries, texts[:20]), expected, atol=0.05)
    near = neighbour_means(emb, y.astype(np.float32), emb[:3], 1)
    assert np.allclose(near[:, 0], y[:3, 0])  # a stored prompt's nearest neighbour is itself


def test_a_gate_whose_difficulty_head_changed_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "router"
    folder.mkdir()
    (tmp_path / "difficulty").mkdir()
    (tmp_path / "difficulty" / "head.onnx").write_bytes(b"another head")
    metrics = {"gate": {"h0": 0.2, "head_dir": "difficulty", "head_sha256": "0" * 64}}
    with pytest.raises(EncoderMismatch, match="retrain the router after the difficulty head"):
        open_rubric(metrics, folder)


def test_a_refit_keeps_the_bench_numbers_only_for_the_same_procedure(tmp_path: Path) -> None:
    x, y, _ = synthetic(200)
    router = fit_linear(x, y, ["small", "large"], 1.0)
    base = {"data": {"files": {"a.jsonl": "1"}}, "training": {"l2": 1.0, "seconds": 3}, "gate": {"h0": 0.5}}
    export_router(router, tmp_path, base | {"evaluation": {"apgr": 0.7}})
    export_router(router, tmp_path, base | {"training": {"l2": 1.0, "seconds": 9}})
    assert json.loads((tmp_path / "metrics.json").read_text())["evaluation"] == {"apgr": 0.7}
    export_router(router, tmp_path, base | {"data": {"files": {"ours.jsonl": "2"}}})
    assert "evaluation" not in json.loads((tmp_path / "metrics.json").read_text())
