"""Fitting quality predictors on measured outcomes (numpy only): the candidates the router bench compares.

Targets are an (n, M) matrix of scores in [0, 1], NaN where a row has no outcome for a model (the sources
measured different models). Every fit reads only the rows that have the model's outcome.

- `fit_linear`: one L2-regularized logistic output per model on standardized features (soft targets, damped
  Newton: gateway.training.fit.newton_logistic). With `groups` (the task of each row) each group also gets
  its own offset while fitting, and the shared weights then learn what varies *within* a task; the served
  offset is the rows' average group offset.
- `knn_predict`: the mean outcome of the k nearest training prompts by cosine of their embeddings (the
  serving code's gateway.classifier.quality.neighbour_means);
- `blend`: the two mixed, as the shipped router serves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.classifier.quality_head import blend_outputs, neighbour_means
from gateway.training.fit import one_blas_thread, newton_logistic, standardization

F64 = npt.NDArray[np.float64]
GROUP_L2 = 1e-3  # the per-task offsets are barely penalized: they absorb what differs between tasks


@dataclass(frozen=True, slots=True)
class LinearRouter:
    """Logistic outputs, one per model: sigmoid(((x - mean) / std) @ weights + bias)."""

    models: tuple[str, ...]
    mean: F64
    std: F64
    weights: F64  # (D, M)
    bias: F64  # (M,)

    def predict(self, x: npt.ArrayLike) -> F64:
        z = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        out: F64 = 0.5 * (1.0 + np.tanh(0.5 * (z @ self.weights + self.bias)))
        return out


def _one_output(z: F64, y: F64, l2: float, groups: npt.NDArray[np.int64] | None, max_iter: int) -> tuple[F64, float]:
    """(weights, bias) of one logistic output on standardized z; group offsets folded into the bias."""
    n, d = z.shape
    blocks = [z]
    n_groups = 0
    if groups is not None:
        codes, groups = np.unique(groups, return_inverse=True)
        n_groups = len(codes)
        blocks.append(np.eye(n_groups)[groups])
    design = np.hstack([*blocks, np.ones((n, 1))])
    penalty = np.concatenate([np.full(d, l2), np.full(n_groups, GROUP_L2), [0.0]])
    theta = np.zeros(design.shape[1])
    mean = float(np.clip(y.mean(), 1e-4, 1 - 1e-4))
    theta[-1] = np.log(mean / (1 - mean))
    with one_blas_thread():
        theta, _ = newton_logistic(design, y, theta, penalty, max_iter)
    bias = float(theta[-1])
    if groups is not None:
        bias += float(np.mean(theta[d:d + n_groups][groups]))
    return theta[:d].copy(), bias


def fit_linear(
    x: npt.ArrayLike, targets: npt.ArrayLike, models: Sequence[str], l2: float | Sequence[float], *,
    groups: Sequence[str] | None = None, max_iter: int = 50,
) -> LinearRouter:
    """One logistic output per column of `targets` (NaN = no outcome: the row is left out of that output)."""
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(targets, dtype=np.float64)
    if xs.ndim != 2 or ys.shape != (xs.shape[0], len(models)):
        raise ValueError(f"need x (n, D) and targets (n, {len(models)}), got {xs.shape} and {ys.shape}")
    l2s = [float(l2)] * len(models) if isinstance(l2, (int, float)) else [float(v) for v in l2]
    mean, std = standardization(xs)
    z = (xs - mean) / std
    codes = None if groups is None else np.unique(np.asarray(groups), return_inverse=True)[1]
    weights = np.zeros((xs.shape[1], len(models)))
    bias = np.zeros(len(models))
    for m in range(len(models)):
        have = ~np.isnan(ys[:, m])
        if have.sum() < 2:
            raise ValueError(f"model {models[m]!r} has {int(have.sum())} outcomes: too few to fit")
        weights[:, m], bias[m] = _one_output(z[have], ys[have, m], l2s[m], None if codes is None else codes[have],
                                             max_iter)
    return LinearRouter(tuple(models), mean, std, weights, bias)


def knn_predict(train_emb: npt.ArrayLike, targets: npt.ArrayLike, test_emb: npt.ArrayLike, k: int = 25) -> F64:
    """(m, M): per model, the mean outcome of the k training rows (with that outcome) nearest by cosine."""
    return np.asarray(neighbour_means(np.asarray(train_emb, dtype=np.float32), np.asarray(targets, dtype=np.float32),
                                      np.asarray(test_emb, dtype=np.float32), k), dtype=np.float64)


def blend(linear: npt.ArrayLike, knn: npt.ArrayLike, alpha: float) -> F64:
    """What the shipped router serves (gateway.classifier.quality.blend_outputs), in float64."""
    return np.asarray(blend_outputs(np.asarray(linear, dtype=np.float64), np.asarray(knn, dtype=np.float64), alpha),
                      dtype=np.float64)
