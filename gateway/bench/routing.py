"""Routing quality as RouteLLM measures it: PGR against the share of calls to the strong tier, APGR.

A router sends a share of prompts to the strong (large) tier. With per-prompt quality `weak[i]`
and `strong[i]`, its quality is the mean of the chosen tier's quality, and the performance gap
recovered PGR = (quality - all-weak) / (all-strong - all-weak). APGR is the area under PGR over
the strong share from 0 to 1 (RouteLLM, Ong et al. 2024): a random router recovers the gap in
proportion to the share it sends, so it scores 0.5; an oracle scores close to 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


def pgr_curve(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike) -> tuple[F64, F64]:
    """(strong share k/n, PGR) for k = 0..n, sending the k highest-scoring prompts to the strong tier.
    Tied scores share their gain (order among equal scores is not the router's choice)."""
    s, w, st = (np.asarray(x, dtype=np.float64) for x in (scores, weak, strong))
    gain = st - w
    total = gain.sum()
    if total <= 0:
        raise ValueError("the strong tier does not beat the weak one on this set: PGR is undefined")
    order = np.argsort(-s, kind="stable")
    ranked_s, ranked_gain = s[order], gain[order]
    _, first, counts = np.unique(-ranked_s, return_index=True, return_counts=True)
    for start, count in zip(first, counts):  # average the gain within groups of tied scores
        ranked_gain[start:start + count] = ranked_gain[start:start + count].mean()
    recovered = np.concatenate([[0.0], np.cumsum(ranked_gain)]) / total
    return np.arange(len(s) + 1, dtype=np.float64) / max(len(s), 1), recovered


def apgr(share: F64, pgr: F64) -> float:
    """Area under PGR over the strong share (trapezoid rule)."""
    return float(np.sum((share[1:] - share[:-1]) * (pgr[1:] + pgr[:-1]) / 2))


def random_apgr(weak: npt.ArrayLike, strong: npt.ArrayLike, trials: int = 200, seed: int = 0) -> float:
    """Mean APGR of routers that send prompts in a random order (expected value 0.5)."""
    rng = np.random.default_rng(seed)
    n = len(np.asarray(weak))
    return float(np.mean([apgr(*pgr_curve(rng.permutation(n), weak, strong)) for _ in range(trials)]))


def pgr_at(scores: npt.ArrayLike, weak: npt.ArrayLike, strong: npt.ArrayLike, cut: float) -> tuple[float, float]:
    """(strong share, PGR) of the threshold router: score >= cut goes to the strong tier."""
    s, w, st = (np.asarray(x, dtype=np.float64) for x in (scores, weak, strong))
    to_strong = s >= cut
    return float(to_strong.mean()), float((st - w)[to_strong].sum() / (st - w).sum())


def cost_per_1k(prompt_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike, to_strong: npt.ArrayLike,
                weak_prices: tuple[float, float], strong_prices: tuple[float, float]) -> float:
    """USD per 1,000 requests; prices are (input, output) USD per million tokens."""
    p, o, big = (np.asarray(x) for x in (prompt_tokens, output_tokens, to_strong))
    price_in = np.where(big, strong_prices[0], weak_prices[0])
    price_out = np.where(big, strong_prices[1], weak_prices[1])
    per_request = (p * price_in + o * price_out) / 1e6
    return float(per_request.mean() * 1000)


def cpt(share: F64, pgr: F64, target: float) -> float:
    """Call-performance threshold (RouteLLM): the smallest strong share whose PGR reaches `target`."""
    reached = np.flatnonzero(pgr >= target - 1e-12)
    return float(share[reached[0]]) if len(reached) else 1.0
