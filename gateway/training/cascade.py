"""Fit the cascade's cheap scorer (gateway.classifier.cascade) to the full model: `gateway train` writes cascade.json.

Target: the logit of the *full model's* score (the fitted head on the encoder's features) of every
labeled row. No label is needed: the cheap scorer imitates the full one, so the bands keep meaning
what the full model's score means. Features: `static_features` of the token ids the encoder reads
(the same head + tail window) and log_chars.

- Ridge regression on standardized features (intercept not penalized), L2 picked by out-of-fold
  RMSE on the head's own validation folds of train (`fold_of(key, seed, folds)`), refit on all of
  train with the standardization folded into the weights.
- Intervals from the out-of-fold residuals (full logit - cheap estimate) of the train rows, per cell
  (token-count bucket x estimate bin; the bins are quintiles of the out-of-fold estimates): the
  (1 - coverage)/2, 0.5 and (1 + coverage)/2 quantiles. A cell with fewer than MIN_CELL rows takes its
  bucket's quantiles, a bucket with fewer all rows'. Nothing here depends on the band cuts: the
  gateway applies the intervals to the cuts of the policies it serves.
- Reported (not fitted on): at given cuts, on the validation folds and on the held-out rows, the share
  decided without the encoder (also weighted by tokens, ~ the encoder time spared), the band agreement
  with the full model, and the held-out AUC of the cascade's score.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.cascade import STATIC_FEATURES, Cascade, CheapModel, WordTable, settle, sigmoid, static_features
from gateway.training.quality import auc

F64 = npt.NDArray[np.float64]
RIDGE_GRID = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
DEFAULT_COVERAGE = 0.95
MIN_CELL = 50
ESTIMATE_BINS = 5
LOGIT_LIMIT = 12.0  # scores of 6e-6 and below (or their mirror) are all "very far from any cut"


def logit(p: npt.ArrayLike) -> F64:
    q = np.clip(np.asarray(p, dtype=np.float64), sigmoid(-LOGIT_LIMIT), sigmoid(LOGIT_LIMIT))
    out: F64 = np.log(q / (1 - q))
    return out


def token_edges(max_tokens: int) -> tuple[int, ...]:
    """Bucket edges of the token count ([CLS] and [SEP] included): short, ..., and exactly the window (cut prompts)."""
    return (*(e for e in (16, 32, 64, 128) if e < max_tokens), max_tokens)


def ridge(x: F64, y: F64, l2: float) -> tuple[F64, float]:
    """(weights, bias) on the raw features minimizing mean squared error + l2 |w|^2 on standardized features."""
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std < 1e-9] = 1.0
    z = (x - mean) / std
    target = y - y.mean()
    w = np.linalg.solve(z.T @ z / len(y) + l2 * np.eye(x.shape[1]), z.T @ target / len(y))
    raw: F64 = w / std
    return raw, float(y.mean() - raw @ mean)


def out_of_fold_estimates(x: F64, y: F64, fold: npt.NDArray[np.int64], l2: float) -> F64:
    oof = np.zeros(len(y))
    for f in np.unique(fold):
        w, b = ridge(x[fold != f], y[fold != f], l2)
        oof[fold == f] = x[fold == f] @ w + b
    return oof


def cell_quantiles(residual: F64, bucket: npt.NDArray[np.int64], bins: npt.NDArray[np.int64], shape: tuple[int, int],
                   coverage: float) -> tuple[F64, F64, F64]:
    """(lo, mid, hi) per cell; a thin cell falls back to its bucket, a thin bucket to all rows."""
    qs = [(1 - coverage) / 2, 0.5, (1 + coverage) / 2]
    overall = np.quantile(residual, qs)
    out = np.zeros((3, *shape))
    for i in range(shape[0]):
        in_bucket = bucket == i
        fallback = np.quantile(residual[in_bucket], qs) if in_bucket.sum() >= MIN_CELL else overall
        for j in range(shape[1]):
            cell = in_bucket & (bins == j)
            out[:, i, j] = np.quantile(residual[cell], qs) if cell.sum() >= MIN_CELL else fallback
    return out[0], out[1], out[2]


@dataclass(frozen=True, slots=True)
class CascadeFit:
    model: CheapModel
    l2: float
    search: list[dict[str, float]]
    validation: dict[str, Any]
    heldout: dict[str, Any]


def fit_cascade(
    ids: Sequence[Sequence[int]], chars: Sequence[int], full_scores: npt.ArrayLike, train: npt.ArrayLike,
    fold: npt.ArrayLike, *, table: WordTable, max_tokens: int, head_sha256: str,
    coverage: float = DEFAULT_COVERAGE, cuts: Sequence[float] = (), hard: npt.ArrayLike | None = None,
) -> CascadeFit:
    """The cheap scorer for the rows' full-model scores; `fold` numbers the train rows' validation slices
    (len = train rows); `cuts` and `hard` (all rows) are only for the report."""
    if not 0.5 <= coverage < 1.0:
        raise ValueError(f"cascade coverage must be in [0.5, 1), got {coverage}")
    tr = np.asarray(train, dtype=bool)
    folds = np.asarray(fold, dtype=np.int64)
    x = np.stack([static_features(table.vectors, row, n) for row, n in zip(ids, chars, strict=True)])
    assert x.shape[1] == STATIC_FEATURES
    z = logit(full_scores)
    tokens = np.array([len(row) for row in ids])
    runs = []
    for l2 in RIDGE_GRID:
        oof = out_of_fold_estimates(x[tr], z[tr], folds, l2)
        runs.append((float(np.sqrt(np.mean((z[tr] - oof) ** 2))), l2, oof))
    rmse, l2, oof = min(runs, key=lambda r: r[0])
    edges = token_edges(max_tokens)
    estimate_edges = tuple(float(e) for e in np.quantile(oof, np.linspace(0, 1, ESTIMATE_BINS + 1)[1:-1]))
    bucket = np.searchsorted(edges, tokens[tr], side="right")
    bins = np.searchsorted(estimate_edges, oof, side="right")
    lo, mid, hi = cell_quantiles(z[tr] - oof, bucket, bins, (len(edges) + 1, len(estimate_edges) + 1), coverage)
    weights, bias = ridge(x[tr], z[tr], l2)
    model = CheapModel(weights, bias, edges, estimate_edges, lo, mid, hi, coverage, max_tokens, head_sha256,
                       table.sha256)
    cascade = Cascade(model, table)
    cascade.use_cuts(cuts)
    scores = np.asarray(full_scores, dtype=np.float64)
    labels = None if hard is None else np.asarray(hard, dtype=bool)
    # validation: the out-of-fold estimates through the same intervals (the model that made them never saw the row)
    val = [_decision(model, cascade.cuts or (), int(t), float(e)) for t, e in zip(tokens[tr], oof, strict=True)]
    held = [cascade.decide(row, n) for row, n, t in zip(ids, chars, tr, strict=True) if not t]
    search = [{"l2": r[1], "oof_rmse": round(r[0], 4)} for r in runs]
    return CascadeFit(
        model, l2, search,
        _report(val, scores[tr], tokens[tr], cuts, None if labels is None else labels[tr]) | {"oof_rmse": round(rmse, 4)},
        _report(held, scores[~tr], tokens[~tr], cuts, None if labels is None else labels[~tr]),
    )


def _decision(model: CheapModel, cuts: Sequence[float], tokens: int, estimate: float) -> float | None:
    """Cascade.decide for a given estimate (the validation rows' out-of-fold ones)."""
    return settle(*model.interval(tokens, estimate), cuts)


def _report(decided: Sequence[float | None], full: F64, tokens: npt.NDArray[np.int64], cuts: Sequence[float],
            hard: npt.NDArray[np.bool_] | None) -> dict[str, Any]:
    """Decided share (also token-weighted), band agreement with the full model at `cuts`, AUC if labels."""
    took = np.array([d is not None for d in decided])
    score = np.array([full[i] if d is None else d for i, d in enumerate(decided)])
    edges = sorted(cuts)
    agree = np.searchsorted(edges, score, side="right") == np.searchsorted(edges, full, side="right")
    out: dict[str, Any] = {
        "n": len(decided), "cuts": [float(c) for c in edges],
        "decided_share": round(float(took.mean()), 4),
        "decided_token_share": round(float(tokens[took].sum() / max(tokens.sum(), 1)), 4),
        "band_agreement": round(float(agree.mean()), 4), "band_disagreements": int((~agree).sum()),
    }
    if hard is not None:
        out["auc_cascade"], out["auc_full"] = auc(score, hard), auc(full, hard)
    return out
