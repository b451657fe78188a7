"""Quality of a difficulty score against labels: rank metrics (AUC, Spearman), the held-out
evaluation `gateway train` records in metrics.json, and its reliability plot (matplotlib).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def average_ranks(values: npt.ArrayLike) -> F64:
    """1-based ranks, ties sharing their average rank."""
    x = np.asarray(values, dtype=np.float64)
    sorter = np.argsort(x, kind="mergesort")
    inverse = np.empty_like(sorter)
    inverse[sorter] = np.arange(len(x))
    xs = x[sorter]
    starts = np.r_[True, xs[1:] != xs[:-1]] if len(x) else np.zeros(0, dtype=bool)
    dense = np.cumsum(starts)[inverse]
    bounds = np.r_[np.nonzero(starts)[0], len(x)]
    ranks: F64 = 0.5 * (bounds[dense] + bounds[dense - 1] + 1)
    return ranks


def auc(scores: npt.ArrayLike, positive: npt.ArrayLike) -> float | None:
    """ROC AUC (Mann-Whitney, ties count half); None without both classes."""
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = average_ranks(scores)
    return round(float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)), 4)


def spearman(a: npt.ArrayLike, b: npt.ArrayLike) -> float | None:
    ra, rb = average_ranks(a), average_ranks(b)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return None
    return round(float(np.corrcoef(ra, rb)[0, 1]), 4)


def evaluate(
    scores: F64, labels: F64, languages: Sequence[str], lengths: F64, min_rows: int = 30, hard_at: float = 0.5
) -> dict[str, Any]:
    """Held-out metrics (AUC vs hard = label >= hard_at, Brier, ...) and per-language AUC (>= min_rows rows)."""
    hard = labels >= hard_at
    cuts = sorted({0.3, 0.5, 0.7, hard_at} if hard_at == 0.5 else {0.5, hard_at, 1.0})
    heldout = {
        "n": len(scores),
        "hard_at": hard_at,
        "hard_share": round(float(hard.mean()), 4),
        "auc": auc(scores, hard),
        "brier": round(float(np.mean((scores - hard) ** 2)), 4),
        "label_mse": round(float(np.mean((scores - labels) ** 2)), 4),
        "spearman": spearman(scores, labels),
        "auc_by_cut": {f"{c:g}": auc(scores, labels >= c) for c in cuts},
        "baseline_auc_log_chars": auc(lengths, hard),
    }
    per_language: dict[str, dict[str, Any]] = {}
    langs = np.array(languages)
    for lang in sorted(set(languages), key=lambda k: (-int((langs == k).sum()), k)):
        m = langs == lang
        n = int(m.sum())
        per_language[lang] = {"n": n, "auc": auc(scores[m], hard[m]) if n >= min_rows else None}
    return {"heldout": heldout, "per_language": per_language}


def write_calibration_plot(path: Path, scores: F64, labels: F64, metrics: dict[str, Any], hard_at: float = 0.5) -> None:
    """Reliability diagram (10 equal-count bins) and score histogram by class, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hard = labels >= hard_at
    bins = np.array_split(np.argsort(scores, kind="mergesort"), min(10, len(scores)))
    mean_p = [float(scores[b].mean()) for b in bins]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    left.plot(mean_p, [float(hard[b].mean()) for b in bins], "o-", label=f"observed hard share (label >= {hard_at:g})")
    left.plot(mean_p, [float(labels[b].mean()) for b in bins], "s--", label="mean label")
    left.set(xlabel="mean predicted difficulty (bin)", ylabel="observed", xlim=(0, 1), ylim=(0, 1),
             title=f"reliability, held-out n={len(scores)}, 10 equal-count bins")
    left.legend(loc="upper left", fontsize=8)
    edges = np.linspace(0, 1, 41)
    right.hist(scores[~hard], bins=edges, alpha=0.6, label=f"easy (label < {hard_at:g})")
    right.hist(scores[hard], bins=edges, alpha=0.6, label=f"hard (label >= {hard_at:g})")
    h = metrics.get("heldout", {})
    right.set(xlabel="difficulty score", ylabel="prompts",
              title=f"held-out scores: AUC {h.get('auc')}, Brier {h.get('brier')}")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
