"""The quality router's arithmetic, numpy only: (embeddings, texts) -> expected score of each measured model.

    measured[m] = sigmoid(((concat(embedding, features) - mean) / std) @ weights[:, m] + bias[m])
                  [blended with kNN: alpha * measured + (1 - alpha) * the k nearest measured prompts' mean]
    gate        = h / (h + gate_h0)       h = the difficulty head's P(hard) on the same embedding
    quality[m]  = 1 - gate * (1 - measured[m])

The outcome data are benchmark items, every one a task with a right answer; on a prompt the rubric calls
trivial (a greeting, "reply with OK") every model answers well, and the gate says so: the predicted shortfall
of each model shrinks with P(hard). gate_h0 = 0 turns the gate off.

router.npz holds `models`, `mean`, `std`, `weights` (D, M), `bias` (M,), `gate_h0` and, when the kNN half is
on, `knn_table`, `knn_targets`, `knn_k`, `blend_alpha`. The training side (gateway.training.router_fit and
router_eval) calls these same functions, so what is measured is what is served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.encoder import EMBEDDING_DIM
from gateway.classifier.head import HeadSession, log_chars
from gateway.classifier.prompt_features import NAMES, feature_matrix

ARRAYS = "router.npz"
F32 = npt.NDArray[np.float32]
HEAD_FILE = "head.onnx"


def neighbour_means(table: F32, targets: F32, queries: F32, k: int) -> F32:
    """(B, M): per model, the mean outcome of the k rows of `table` (unit vectors, with that model's outcome:
    targets not NaN) nearest each query by cosine; NaN where a model has no row. Models measured on the same
    rows (one source) share one neighbour search."""
    sims = queries @ table.T
    out = np.full((queries.shape[0], targets.shape[1]), np.nan, dtype=np.float32)
    measured = ~np.isnan(targets)
    for pattern in np.unique(measured.T, axis=0):
        rows = np.flatnonzero(pattern)
        if not len(rows):
            continue
        models = np.flatnonzero((measured.T == pattern).all(axis=1))
        kk = min(k, len(rows))
        near = rows[np.argpartition(-sims[:, rows], kk - 1, axis=1)[:, :kk]]
        out[:, models] = targets[near][:, :, models].mean(axis=1)
    return out


def blend_outputs(linear: npt.NDArray[Any], near: npt.NDArray[Any], alpha: float) -> npt.NDArray[Any]:
    """alpha * linear + (1 - alpha) * near, the linear output alone where kNN has no neighbours (NaN)."""
    out: npt.NDArray[Any] = np.where(np.isnan(near), linear, alpha * linear + (1 - alpha) * near)
    return out


def rubric_gate(measured: npt.NDArray[np.floating[Any]], hard: npt.ArrayLike, gate_h0: float) -> F32:
    """quality = 1 - gate * (1 - measured), gate = hard / (hard + gate_h0); (B, M) from (B, M) and (B,)."""
    if gate_h0 <= 0:
        return np.asarray(measured, dtype=np.float32)
    h = np.asarray(hard, dtype=np.float64).reshape(-1, 1)
    out: F32 = (1.0 - h / (h + gate_h0) * (1.0 - measured)).astype(np.float32)
    return out


@dataclass(frozen=True, slots=True)
class Neighbours:
    """The kNN part: training prompts' embeddings (unit rows) and outcomes (NaN: unmeasured), k, blend weight."""

    table: F32
    targets: F32
    k: int
    alpha: float  # weight of the logistic outputs; 1 - alpha on the neighbours' mean

    @classmethod
    def from_arrays(cls, data: Mapping[str, npt.NDArray[Any]]) -> Neighbours:
        """From router.npz: `knn_table` float16 (n, 384), `knn_targets` float16 (n, M)."""
        return cls(data["knn_table"].astype(np.float32), data["knn_targets"].astype(np.float32), int(data["knn_k"]),
                   float(data["blend_alpha"]))

    def arrays(self) -> dict[str, npt.NDArray[Any]]:
        """What from_arrays reads, in float16 (int8 would halve the file but swap a neighbour now and then)."""
        return {"knn_table": self.table.astype(np.float16), "knn_targets": self.targets.astype(np.float16),
                "knn_k": np.array(self.k, np.int32), "blend_alpha": np.array(self.alpha, np.float32)}


class QualityHead:
    """The fitted outputs on numpy: (B, 384) embeddings + texts -> (B, M) expected scores."""

    def __init__(self, models: Sequence[str], mean: F32, std: F32, weights: F32, bias: F32, *,
                 gate_h0: float = 0.0, rubric: HeadSession | None = None,
                 neighbours: Neighbours | None = None) -> None:
        width = EMBEDDING_DIM + len(NAMES)
        if mean.shape != (width,) or std.shape != (width,) or weights.shape != (width, len(models)) \
                or bias.shape != (len(models),):
            raise ValueError(f"router arrays do not fit {width} features and {len(models)} models: "
                             f"mean {mean.shape}, std {std.shape}, weights {weights.shape}, bias {bias.shape}")
        if not np.all(std > 0) or not all(np.all(np.isfinite(a)) for a in (mean, weights, bias)):
            raise ValueError("router arrays hold non-finite values or a non-positive std")
        if gate_h0 > 0 and rubric is None:
            raise ValueError(f"the router's rubric gate (gate_h0 {gate_h0}) needs the difficulty head")
        self.models = tuple(models)
        self.gate_h0 = float(gate_h0)
        self.rubric = rubric
        if neighbours is not None and neighbours.targets.shape[1] != len(models):
            raise ValueError(f"the neighbour table has {neighbours.targets.shape[1]} models, the router {len(models)}")
        self.neighbours = neighbours
        # folded: ((x - mean) / std) @ W + b == x @ (W / std) + (b - (mean / std) @ W)
        self._weights = np.ascontiguousarray(weights / std[:, None], dtype=np.float32)
        self._bias = (bias - (mean / std) @ weights).astype(np.float32)

    @classmethod
    def load(cls, path: Path, rubric: HeadSession | None = None) -> QualityHead:
        with np.load(path, allow_pickle=False) as data:
            gate = float(data["gate_h0"]) if "gate_h0" in data else 0.0
            neighbours = Neighbours.from_arrays(data) if "knn_table" in data else None
            return cls([str(m) for m in data["models"]], *(data[k].astype(np.float32)
                                                           for k in ("mean", "std", "weights", "bias")),
                       gate_h0=gate, rubric=rubric if gate > 0 else None, neighbours=neighbours)

    def linear(self, embeddings: npt.ArrayLike, texts: Sequence[str]) -> F32:
        """The logistic outputs: (B, M)."""
        emb = np.asarray(embeddings, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
        x = np.hstack([emb, feature_matrix(texts)])
        logits = x @ self._weights + self._bias
        out: F32 = (0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32)
        return out

    def measured(self, embeddings: npt.ArrayLike, texts: Sequence[str]) -> F32:
        """The outcome model before the gate: the logistic outputs, blended with kNN when the file has a table."""
        linear = self.linear(embeddings, texts)
        if self.neighbours is None:
            return linear
        emb = np.asarray(embeddings, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
        near = neighbour_means(self.neighbours.table, self.neighbours.targets, emb, self.neighbours.k)
        return np.asarray(blend_outputs(linear, near, self.neighbours.alpha), dtype=np.float32)

    def scores(self, embeddings: npt.ArrayLike, texts: Sequence[str]) -> F32:
        """Expected score of each model, gated by the rubric: (B, M) in [0, 1]."""
        measured = self.measured(embeddings, texts)
        if self.rubric is None:
            return measured
        emb = np.asarray(embeddings, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
        return rubric_gate(measured, self.rubric.score(emb, log_chars(texts)), self.gate_h0)
