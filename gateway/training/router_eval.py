"""Held-out evaluation of quality routers on measured outcomes: the designs, the pairs and the routers compared.

Designs (each fits on its training rows only, and never looks at the test rows):
- `hash`: train on the rows whose normalized prompt hashes to "train", test on the others (OutcomeRow.split);
- `loto` (leave one task out): for each task of a pair's source, train on every other row, test on the task;
- `loso` (leave one source out): train on the other sources, test on this one. The models differ between
  sources, so the router's score for the test pair is its predicted gain for the *other* sources' pairs
  (each standardized over the test prompts, then averaged): does "a small model falls short here" transfer?

Routers: random, prompt length, the rubric head (models/difficulty), kNN (k = 25, cosine on the same
embedding), the logistic outputs alone (`linear`), the shipped router (`router`: alpha * linear + (1 - alpha)
* kNN, then the rubric gate) and the oracle (the true gain). A router's score sends a prompt to the strong
model when high. `select_alpha` picks the blend weight on validation folds of the hash split's training rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.quality_head import rubric_gate
from gateway.training.route_metrics import (
    Interval, apgr, bootstrap_indices, paired_difference, random_summary, summarize,
)
from gateway.training.router_data import OutcomeSet
from gateway.training.router_fit import blend, fit_linear, knn_predict
from gateway.training.router_train import KNN_K

F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
MIN_TASK_ROWS = 30


@dataclass(frozen=True, slots=True)
class Pair:
    name: str
    source: str
    weak: str
    strong: str


PAIRS = (
    Pair("7B vs 51B (dcrouter)", "llmrouter-dcrouter", "mistral-7b-instruct-v0.3", "llama-3.1-nemotron-51b-instruct"),
    Pair("7B vs 49B (dcrouter)", "llmrouter-dcrouter", "mistral-7b-instruct-v0.3", "llama-3.3-nemotron-super-49b-v1"),
    Pair("Mixtral-8x7B vs GPT-4-1106 (arena-hard)", "arena-hard-v1", "mistralai/Mixtral-8x7B-Instruct-v0.1",
         "gpt-4-1106-preview"),
    Pair("Claude-3-Haiku vs Gemini-2.0-Flash (RouterArena)", "routerarena", "claude-3-haiku-20240307",
         "gemini-2.0-flash-001"),
)
ROUTERS = ("random", "length", "rubric", "knn", "linear", "router", "oracle")


@dataclass(frozen=True, slots=True)
class Context:
    """What every design reads: the data, the rubric head's P(hard) per row, the gate and the fit's L2."""

    data: OutcomeSet
    hard: F64
    gate_h0: float
    l2: float
    alpha: float  # the blend's weight on the logistic outputs (1 - alpha on kNN)

    def measured(self, pair: Pair) -> Mask:
        return ~np.isnan(self.data.column(pair.weak)) & ~np.isnan(self.data.column(pair.strong))

    @property
    def sources(self) -> npt.NDArray[np.str_]:
        return np.array([r.source for r in self.data.rows])

    @property
    def tasks(self) -> npt.NDArray[np.str_]:
        return np.array([r.task for r in self.data.rows])


@dataclass(frozen=True, slots=True)
class Fitted:
    """Predictions of the routers fitted on one training set, for one set of test rows (all models)."""

    linear: F64  # (m, M) logistic outputs
    knn: F64  # (m, M)
    hard: F64  # (m,) the rubric head's P(hard)

    def take(self, keep: Mask) -> Fitted:
        return Fitted(self.linear[keep], self.knn[keep], self.hard[keep])

    def router(self, alpha: float, gate_h0: float) -> F64:
        """The shipped router's outputs: the blend, then the rubric gate."""
        return np.asarray(rubric_gate(blend(self.linear, self.knn, alpha), self.hard, gate_h0), dtype=np.float64)


def fit_and_predict(ctx: Context, train: Mask, test: Mask, models: set[str] | None = None) -> Fitted:
    """Fit on `train` (the outputs of `models`, default all measured there), predict `test`."""
    d = ctx.data
    have = [i for i in range(len(d.models)) if np.any(~np.isnan(d.targets[train, i]))
            and (models is None or d.models[i] in models)]
    names = [d.models[i] for i in have]
    router = fit_linear(d.x[train], d.targets[train][:, have], names, ctx.l2)
    linear = np.full((int(test.sum()), len(d.models)), np.nan)
    linear[:, have] = router.predict(d.x[test])
    knn = knn_predict(d.embeddings[train], d.targets[train], d.embeddings[test], KNN_K)
    return Fitted(linear, knn, ctx.hard[test])


def pair_scores(ctx: Context, fitted: Fitted, test: Mask, gain_of: Callable[[F64], F64]) -> dict[str, F64]:
    """Each router's score on the test rows; `gain_of` turns an (m, M) prediction into a gain."""
    d = ctx.data
    return {
        "length": np.array([len(d.rows[i].prompt) for i in np.flatnonzero(test)], dtype=np.float64),
        "rubric": ctx.hard[test],
        "knn": gain_of(fitted.knn),
        "linear": gain_of(fitted.linear),
        "router": gain_of(fitted.router(ctx.alpha, ctx.gate_h0)),
    }


def direct_gain(ctx: Context, pair: Pair) -> Callable[[F64], F64]:
    wi, si = ctx.data.models.index(pair.weak), ctx.data.models.index(pair.strong)
    return lambda p: np.asarray(p[:, si] - p[:, wi], dtype=np.float64)


def transferred_gain(ctx: Context, others: list[Pair]) -> Callable[[F64], F64]:
    """The mean of the other pairs' predicted gains, each standardized over the test rows."""
    def gain(p: F64) -> F64:
        parts = []
        for pair in others:
            g = direct_gain(ctx, pair)(p)
            parts.append((g - g.mean()) / (g.std() + 1e-12))
        return np.asarray(np.mean(parts, axis=0), dtype=np.float64)
    return gain


def measure(scores: dict[str, F64], weak: F64, strong: F64, rounds: int, seed: int = 0,
            paired_against: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every router's metrics with bootstrap intervals (the same resamples for all), random and oracle included;
    `paired_against`: APGR(router) - APGR(baseline) with paired intervals."""
    idx = bootstrap_indices(len(weak), rounds, seed)
    out: dict[str, Any] = {"n": len(weak), "weak_mean": round(float(weak.mean()), 4),
                           "strong_mean": round(float(strong.mean()), 4), "routers": {}}
    table: dict[str, dict[str, Interval]] = {"random": random_summary(weak, strong, idx)}
    for name, s in scores.items():
        table[name] = summarize(s, weak, strong, idx)
    table["oracle"] = summarize(strong - weak, weak, strong, idx)
    out["routers"] = {name: {k: v.as_list() for k, v in metrics.items()} for name, metrics in table.items()}
    out["router_minus"] = {b: paired_difference(scores["router"], scores[b], weak, strong, idx).as_list()
                           for b in paired_against}
    return out


def outcome_arrays(ctx: Context, pair: Pair, test: Mask) -> tuple[F64, F64]:
    return ctx.data.column(pair.weak)[test], ctx.data.column(pair.strong)[test]


def hash_design(ctx: Context, rounds: int) -> dict[str, Any]:
    split = np.array([r.split for r in ctx.data.rows])
    train = split == "train"
    results: dict[str, Any] = {}
    fitted_all = fit_and_predict(ctx, train, ~train)
    for pair in PAIRS:
        test_all = ~train
        keep = (ctx.measured(pair) & (ctx.sources == pair.source))[test_all]
        sub = fitted_all.take(keep)
        test = test_all.copy()
        test[test_all] = keep
        scores = pair_scores(ctx, sub, test, direct_gain(ctx, pair))
        results[pair.name] = measure(scores, *outcome_arrays(ctx, pair, test), rounds,
                                     paired_against=("length", "knn", "rubric"))
    return results


def loto_design(ctx: Context, pairs: tuple[Pair, ...], rounds: int) -> dict[str, dict[str, Any]]:
    """{pair: {task: result}}: per task of the pairs' source (>= MIN_TASK_ROWS rows), train without it, test on it."""
    tasks, sources = ctx.tasks, ctx.sources
    source = pairs[0].source
    if any(p.source != source for p in pairs):
        raise ValueError("leave-one-task-out takes pairs of one source")
    results: dict[str, dict[str, Any]] = {p.name: {} for p in pairs}
    needed = {m for p in pairs for m in (p.weak, p.strong)}
    for task in sorted(set(tasks[sources == source])):
        in_task = (tasks == task) & (sources == source)
        fitted = fit_and_predict(ctx, ~in_task, in_task, needed) if in_task.sum() >= MIN_TASK_ROWS else None
        for pair in pairs:
            results[pair.name][task] = _one_task(ctx, pair, in_task, fitted, rounds)
    return results


def _one_task(ctx: Context, pair: Pair, in_task: Mask, fitted: Fitted | None, rounds: int) -> dict[str, Any]:
    keep = ctx.measured(pair)[in_task]
    test = in_task & ctx.measured(pair)
    weak, strong = outcome_arrays(ctx, pair, test)
    if fitted is None or test.sum() < MIN_TASK_ROWS:
        return {"n": int(test.sum()), "skipped": f"fewer than {MIN_TASK_ROWS} rows"}
    if strong.mean() <= weak.mean():
        return {"n": int(test.sum()), "skipped": "the strong model does not beat the weak one on this task "
                f"({strong.mean():.3f} vs {weak.mean():.3f}): APGR is undefined"}
    scores = pair_scores(ctx, fitted.take(keep), test, direct_gain(ctx, pair))
    return measure(scores, weak, strong, rounds, paired_against=("length", "knn", "rubric"))


def loso_design(ctx: Context, rounds: int) -> dict[str, Any]:
    """Per source: train on the others; the test pair is scored by the other sources' pairs' gains."""
    results: dict[str, Any] = {}
    sources = ctx.sources
    for pair in PAIRS:
        if pair.name in results or any(p.source == pair.source for p in PAIRS[:PAIRS.index(pair)]):
            continue  # one pair per source: the first listed
        test = (sources == pair.source) & ctx.measured(pair)
        train = sources != pair.source
        others = [p for p in PAIRS if p.source != pair.source and
                  all(p.source != q.source for q in PAIRS[:PAIRS.index(p)])]
        fitted = fit_and_predict(ctx, train, test)
        scores = pair_scores(ctx, fitted, test, transferred_gain(ctx, others))
        result = measure(scores, *outcome_arrays(ctx, pair, test), rounds, paired_against=("length", "knn", "rubric"))
        result["scored_by"] = [p.name for p in others]
        results[pair.name] = result
    return results


def validation_grid(ctx: Context, alphas: tuple[float, ...], gates: tuple[float, ...],
                    folds: int = 4) -> dict[tuple[float, float], float]:
    """{(alpha, gate_h0): mean APGR over the pairs and `folds` validation folds of the hash-train rows}: how the
    blend weight and the gate are chosen without the test rows."""
    rows = ctx.data.rows
    train = np.array([r.split == "train" for r in rows])
    fold = np.array([int(r.key[:8], 16) % folds for r in rows])
    scores: dict[tuple[float, float], list[float]] = {(a, g): [] for a in alphas for g in gates}
    for f in range(folds):
        val = train & (fold == f)
        fitted = fit_and_predict(ctx, train & (fold != f), val)
        for pair in PAIRS:
            keep = (ctx.measured(pair) & (ctx.sources == pair.source))[val]
            weak, strong = (ctx.data.column(m)[val][keep] for m in (pair.weak, pair.strong))
            for a, g in scores:
                scores[a, g].append(apgr(direct_gain(ctx, pair)(fitted.take(keep).router(a, g)), weak, strong))
    return {key: round(float(np.nanmean(v)), 4) for key, v in scores.items()}
