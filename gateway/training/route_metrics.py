"""Router quality on measured outcomes, the way RouteLLM reports it, with bootstrap intervals.

A router gives each prompt a score; a threshold sends the prompts scoring at or above it to the strong model.
`decile_curve` sweeps 11 thresholds at the deciles of the router's own scores (at the top edge a prompt goes
to strong only when its score is above it), and records the strong-call share and the mean quality of the
chosen answers at each. APGR = the trapezoid area between that curve and the weak model's line, over the
strong-call share, divided by the strong-weak gap (random routing: 0.5 in expectation). CPT(x) is the
strong-call share at which the curve (linear between its points) first recovers x of the gap;
`share_for_quality` the share at which quality first reaches a fraction of the strong model's.
(gateway.bench.routing ranks every prompt instead of 11 thresholds: the difficulty bench's older measure.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
Curve = tuple[F64, F64]  # (strong-call share ascending, mean quality)
Scorer = Callable[[npt.NDArray[np.int64]], F64]  # bootstrap indices -> the router's scores on them


def decile_curve(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike) -> Curve:
    """(strong share, quality) at the 11 decile thresholds of `scores`, sorted by share."""
    s, w, st = (np.asarray(x, dtype=np.float64) for x in (scores, weak, strong))
    edges = np.quantile(s, np.linspace(0.0, 1.0, 11))
    shares, quality = np.empty(11), np.empty(11)
    for i, edge in enumerate(edges):
        to_strong = s > edge if i == 10 else s >= edge
        shares[i] = to_strong.mean()
        quality[i] = np.where(to_strong, st, w).mean()
    order = np.argsort(shares, kind="stable")
    return shares[order], quality[order]


def _mean(values: npt.ArrayLike) -> float:
    return float(np.mean(np.asarray(values, dtype=np.float64)))


def gap(weak: npt.ArrayLike, strong: npt.ArrayLike) -> float:
    return _mean(strong) - _mean(weak)


def apgr(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike) -> float:
    """RouteLLM's APGR on the decile curve; nan when the strong model does not beat the weak one here."""
    g = gap(weak, strong)
    if g <= 0:
        return float("nan")
    share, quality = decile_curve(scores, weak, strong)
    area = float(np.sum(np.diff(share) * (quality[1:] + quality[:-1]) / 2))
    weak_area = _mean(weak) * float(share[-1] - share[0])
    return (area - weak_area) / g


def first_share(share: F64, values: F64, target: float) -> float:
    """The smallest share at which the piecewise-linear curve (share, values) reaches `target` (1.0 if never)."""
    if values[0] >= target:
        return float(share[0])
    for i in range(1, len(share)):
        if values[i] >= target:
            lo, hi = values[i - 1], values[i]
            t = (target - lo) / (hi - lo) if hi > lo else 1.0
            return float(share[i - 1] + t * (share[i] - share[i - 1]))
    return 1.0


def cpt(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike, recovered: float) -> float:
    """CPT(recovered): strong-call share needed to recover that fraction of the strong-weak gap."""
    g = gap(weak, strong)
    if g <= 0:
        return float("nan")
    share, quality = decile_curve(scores, weak, strong)
    return first_share(share, (quality - _mean(weak)) / g, recovered)


def share_for_quality(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike, fraction: float = 0.95) -> float:
    """Strong-call share needed for `fraction` of the strong model's mean quality (0 when weak already has it)."""
    share, quality = decile_curve(scores, weak, strong)
    return first_share(share, quality, fraction * _mean(strong))


METRICS: dict[str, Callable[[F64, F64, F64], float]] = {
    "apgr": apgr,
    "cpt50": lambda s, w, st: cpt(s, w, st, 0.5),
    "cpt80": lambda s, w, st: cpt(s, w, st, 0.8),
    "share95": share_for_quality,
}


@dataclass(frozen=True, slots=True)
class Interval:
    value: float
    low: float
    high: float

    def as_list(self, digits: int = 3) -> list[float]:
        return [round(self.value, digits), round(self.low, digits), round(self.high, digits)]


def bootstrap_indices(n: int, rounds: int, seed: int = 0) -> npt.NDArray[np.int64]:
    """(rounds, n) resamples of 0..n-1 with replacement; the same for every router compared (paired)."""
    return np.random.default_rng(seed).integers(0, n, size=(rounds, n))


def _interval(value: float, draws: list[float]) -> Interval:
    kept = np.array([d for d in draws if np.isfinite(d)])
    if not len(kept):
        return Interval(value, float("nan"), float("nan"))
    low, high = np.percentile(kept, [2.5, 97.5])
    return Interval(value, float(low), float(high))


def summarize(scores: F64, weak: F64, strong: F64, resamples: npt.NDArray[np.int64]) -> dict[str, Interval]:
    """Each metric of METRICS with its bootstrap 95 % interval over `resamples`."""
    out: dict[str, Interval] = {}
    for name, metric in METRICS.items():
        draws = [metric(scores[i], weak[i], strong[i]) for i in resamples]
        out[name] = _interval(metric(scores, weak, strong), draws)
    return out


def paired_difference(a: F64, b: F64, weak: F64, strong: F64, resamples: npt.NDArray[np.int64]) -> Interval:
    """APGR(a) - APGR(b) on the same prompts and the same resamples, with its 95 % interval."""
    draws = [apgr(a[i], weak[i], strong[i]) - apgr(b[i], weak[i], strong[i]) for i in resamples]
    return _interval(apgr(a, weak, strong) - apgr(b, weak, strong), draws)


def random_summary(weak: F64, strong: F64, resamples: npt.NDArray[np.int64], seed: int = 1) -> dict[str, Interval]:
    """Random routing: each resample with fresh random scores; the value is the mean over the resamples."""
    rng = np.random.default_rng(seed)
    out: dict[str, Interval] = {}
    draws: Mapping[str, list[float]] = {name: [] for name in METRICS}
    for i in resamples:
        s = rng.random(len(i))
        for name, metric in METRICS.items():
            draws[name].append(metric(s, weak[i], strong[i]))
    for name in METRICS:
        kept = [d for d in draws[name] if np.isfinite(d)]
        out[name] = _interval(float(np.mean(kept)) if kept else float("nan"), draws[name])
    return out
