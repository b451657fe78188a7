"""`gateway train --from-shadow PAIRS.jsonl`: router labels from the gateway's own shadow pairs, a head fitted on
them, and the new head's AUC on held-out pairs against the shipped head.

    gateway train --from-shadow .gateway/shadow-pairs.jsonl [MORE.jsonl...] [--out models/difficulty-shadow]
        [--signal agreement|judge] [--agree-below 0.75] [--shipped models/difficulty] [--heldout-share 0.3]

A pair (gateway.experiments.shadow.ShadowPair, one JSON line) holds a prompt the `from` tier answered, the
reference tier's answer to the same request and their agreement. Low agreement says the small tier was not
enough: the pair's label is hard (1) when the signal is below the cut, else easy (0). The signal is the
answers' agreement (cosine of their MiniLM sentence embeddings) or, with `--signal judge`, the judge tier's
grade in [0, 1]. Pairs are split into train and held-out by a hash of the prompt (a prompt repeated in the
traffic stays on one side). The head is fitted as `gateway train` fits one (L2 on validation folds of train,
Platt-scaled so its score estimates P(hard)), on the features the shipped head reads (its encoder file,
checked by SHA-256), so the two heads are compared on the same held-out pairs: AUC each, and the difference
with a paired bootstrap 95 % interval (`better` / `worse` when it excludes zero, else `inconclusive`).

With `--out` the new head is written as a model folder (head.onnx, metrics.json with a `shadow` section,
thresholds.json, calibration.png): serve it by pointing the policy's `routing.classifier` at it, and
recalibrate the bands (`gateway calibrate`) since its scores mean P(hard on your traffic).
Exit status: 0 done, 2 bad arguments, unreadable pairs or too few of them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.difficulty import encoder_graph, open_parts, read_metrics
from gateway.classifier.embedding_cache import cache_key
from gateway.classifier.head import log_chars
from gateway.training.embedding import EmbeddingFile
from gateway.training.quality import auc, evaluate
from gateway.training.fit import HeadParams
from gateway.training.train import Fitted, LabeledPrompt, features, fit, hash_split, write_artifacts

F64 = npt.NDArray[np.float64]
SIGNALS = {"agreement": "agreement", "judge": "judge_score"}
DEFAULT_CUT = {"agreement": 0.75, "judge": 0.6}
MIN_TRAIN, MIN_CLASS = 20, 3  # pairs in train; hard and easy pairs in each split
LEVEL = 0.95


@dataclass(frozen=True, slots=True)
class ShadowLabel:
    key: str  # the prompt's hash: the split follows it
    prompt: str
    hard: float  # 1: the signal was below the cut (the `from` tier was not enough)
    signal: float
    split: str


@dataclass(slots=True)
class PairCounts:
    read: int = 0
    used: int = 0
    no_signal: int = 0  # the reference failed, or no judge grade
    malformed: int = 0
    routes: Counter[str] | None = None  # "from -> to" of the pairs used


def read_pairs(paths: Iterable[Path], counts: PairCounts) -> list[dict[str, Any]]:
    """The JSON objects of the pair files (a malformed line, e.g. a torn last one, is counted and skipped)."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").split("\n"):  # not splitlines(): prompts hold U+2028
            if not line.strip():
                continue
            counts.read += 1
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                counts.malformed += 1
                continue
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
                counts.malformed += 1
                continue
            rows.append(row)
    return rows


def label_pairs(rows: Sequence[dict[str, Any]], signal: str, cut: float, heldout_share: float,
                counts: PairCounts) -> list[ShadowLabel]:
    """One label per pair with the signal: hard when it is below `cut`."""
    field = SIGNALS[signal]
    counts.routes = Counter()
    out = []
    for row in rows:
        value = row.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            counts.no_signal += 1
            continue
        key = cache_key(row["prompt"])
        out.append(ShadowLabel(key, row["prompt"], float(value < cut), float(value), hash_split(key, heldout_share)))
        counts.routes[f"{row.get('from_tier')} -> {row.get('to_tier')}"] += 1
    counts.used = len(out)
    return out


def check_split(labels: Sequence[ShadowLabel]) -> None:
    """ValueError unless train and held-out both have enough pairs of each class."""
    for split, least in (("train", MIN_TRAIN), ("heldout", 2 * MIN_CLASS)):
        part = [label.hard for label in labels if label.split == split]
        hard = int(sum(part))
        if len(part) < least or min(hard, len(part) - hard) < MIN_CLASS:
            raise ValueError(f"{split} has {len(part)} pairs ({hard} hard): need >= {least}, with >= {MIN_CLASS} "
                             "hard and easy each; collect more pairs, or move --agree-below")


def fit_head_on(x: F64, y: F64, keys: Sequence[str], *, l2: float | None = None, seed: int = 0, val_folds: int = 5,
                epochs: int = 100) -> Fitted:
    """`gateway train`'s fit (L2 on validation folds, Platt scaling to P(hard)) on 0/1 labels. With few pairs the
    out-of-fold scores can rank hard pairs below easy ones by chance; Platt scaling would then flip the head's
    ranking (slope < 0), so the head is kept unscaled instead (`platt` None)."""
    args = argparse.Namespace(l2=l2, seed=seed, val_folds=val_folds, epochs=epochs, standardize="all",
                              calibration="platt", hard_at=0.5)
    fitted = fit(x, y, keys, args)
    if fitted.platt is None or fitted.platt[0] > 1e-6:
        return fitted
    a, c = fitted.platt
    if a < -1e-6:  # undo sigmoid(a * logit + c): the fitted head's own weights
        head = HeadParams(fitted.head.weights / a, (fitted.head.bias - c) / a, fitted.head.mean, fitted.head.std)
        return Fitted(head, fitted.l2, fitted.iterations, fitted.search, None)
    return fit(x, y, keys, argparse.Namespace(**{**vars(args), "calibration": "none"}))


def compare_heads(new: F64, shipped: F64, hard: F64, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Held-out AUC of each head and of their difference, with paired percentile-bootstrap 95 % intervals."""
    positive = hard >= 0.5
    rng = np.random.default_rng(seed)
    diffs, news, olds = [], [], []
    for _ in range(n_boot):
        pick = rng.integers(0, len(hard), len(hard))
        a, b = auc(new[pick], positive[pick]), auc(shipped[pick], positive[pick])
        if a is not None and b is not None:
            news.append(a)
            olds.append(b)
            diffs.append(a - b)
    new_auc, shipped_auc = auc(new, positive), auc(shipped, positive)
    low, high = _interval(diffs)
    verdict = "inconclusive"
    if low is not None and high is not None and (low > 0 or high < 0):
        verdict = "better" if low > 0 else "worse"
    return {
        "n": len(hard), "hard": int(positive.sum()),
        "new_auc": new_auc, "new_auc_ci": _interval(news),
        "shipped_auc": shipped_auc, "shipped_auc_ci": _interval(olds),
        "diff": None if new_auc is None or shipped_auc is None else round(new_auc - shipped_auc, 4),
        "diff_ci": [low, high], "verdict": verdict, "bootstrap": n_boot,
    }


def _interval(values: Sequence[float]) -> list[float | None]:
    if len(values) < 2:
        return [None, None]
    lo, hi = np.percentile(values, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return [round(float(lo), 4), round(float(hi), 4)]


def from_shadow(args: argparse.Namespace) -> dict[str, Any]:
    """Label, embed, fit, compare (and write the head with --out); returns metrics.json's content."""
    started = time.perf_counter()
    counts = PairCounts()
    cut = args.agree_below if args.agree_below is not None else DEFAULT_CUT[args.signal]
    labels = label_pairs(read_pairs(args.from_shadow, counts), args.signal, cut, args.heldout_share, counts)
    check_split(labels)
    shipped_metrics = read_metrics(args.shipped)
    encoder, shipped_head, variant, sha = open_parts(args.shipped, providers=["CPUExecutionProvider"],
                                                     threads=args.threads)
    prompts = [label.prompt for label in labels]
    emb = EmbeddingFile(args.embed_cache, sha, encoder.tokenizer.max_tokens).embed(encoder, prompts, variant)
    x, y = features(emb, prompts), np.array([label.hard for label in labels])
    train = np.array([label.split == "train" for label in labels])
    fitted = fit_head_on(x[train], y[train], [label.key for label in labels if label.split == "train"],
                         l2=args.l2, seed=args.seed)
    new = fitted.head.predict(x[~train])
    shipped = shipped_head.score(emb[~train], log_chars([p for p, t in zip(prompts, train) if not t])).astype(
        np.float64)
    comparison = compare_heads(new, shipped, y[~train], args.bootstrap, args.seed)
    held = [LabeledPrompt(label.key, label.prompt, label.hard, label.split, "") for label in labels
            if label.split == "heldout"]
    graph = encoder_graph(shipped_metrics)
    metrics: dict[str, Any] = {
        "model": "difficulty-head",
        "score": "P(hard on shadow traffic) after Platt scaling",
        "hard_at": 0.5,
        "features": ["embedding[384]", "log_chars = log1p(len(prompt))"],
        "encoder": {"graph": graph.name, "layers": graph.layers, "pooled": list(graph.pooled), "variant": variant,
                    "file": encoder.model_path.name, "sha256": sha, "provider": encoder.provider,
                    "max_tokens": encoder.tokenizer.max_tokens},  # the shipped head's window: the same features
        "compatible_encoders": {variant: {"file": encoder.model_path.name, "sha256": sha}},
        "data": {"path": [str(p) for p in args.from_shadow], "sha256": [_sha256(p) for p in args.from_shadow],
                 "label_source": f"shadow {args.signal} < {cut:g}"},
        "counts": {"pairs_read": counts.read, "pairs_used": counts.used, "no_signal": counts.no_signal,
                   "malformed": counts.malformed, "train": int(train.sum()), "heldout": int((~train).sum()),
                   "hard_share": round(float(y.mean()), 4), "routes": dict(counts.routes or {})},
        **evaluate(new, y[~train], [""] * len(held), x[~train, -1]),
        "shadow": {"signal": args.signal, "cut": cut, "shipped": str(args.shipped), **comparison},
        "training": {"l2": fitted.l2, "l2_search": fitted.search, "standardize": "all", "target": "hard",
                     "platt": fitted.platt and [round(v, 6) for v in fitted.platt],
                     "newton_iterations": fitted.iterations, "seed": args.seed,
                     "total_seconds": round(time.perf_counter() - started, 2)},
    }
    if args.out is not None:
        onnx_bytes = fitted.head.to_onnx({"encoder_graph": graph.name, "encoder_variant": variant,
                                          "encoder_sha256": sha, "labels": "shadow"})
        write_artifacts(args.out, onnx_bytes, metrics, new, held)
    return metrics


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def report(m: dict[str, Any], out: Path | None) -> str:
    c, s = m["counts"], m["shadow"]
    lines = [
        f"pairs: {c['pairs_read']:,} read, {c['pairs_used']:,} usable ({c['no_signal']:,} without {s['signal']}, "
        f"{c['malformed']:,} malformed); train {c['train']:,}, held out {c['heldout']:,}; hard ({s['signal']} < "
        f"{s['cut']:g}): {100 * c['hard_share']:.1f} %",
        f"new head:     held-out AUC {s['new_auc']} {_ci(s['new_auc_ci'])}",
        f"shipped head: held-out AUC {s['shipped_auc']} {_ci(s['shipped_auc_ci'])}  ({s['shipped']})",
        f"difference:   {s['diff']:+.4f} {_ci(s['diff_ci'])} over {s['n']:,} held-out pairs ({s['hard']} hard): "
        f"the new head is {s['verdict']}" if s["diff"] is not None else "difference: n/a",
        f"wrote {out}: head.onnx, metrics.json, thresholds.json, calibration.png" if out else
        "not written (no --out)",
    ]
    return "\n".join(lines)


def _ci(pair: Sequence[float | None]) -> str:
    return "[n/a]" if pair[0] is None or pair[1] is None else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway train --from-shadow",
                                description="Fit the difficulty head on shadow pairs; compare it with the shipped one.")
    p.add_argument("--from-shadow", type=Path, nargs="+", required=True, metavar="PAIRS.jsonl",
                   help="shadow pair files (the gateway's --shadow-pairs, or Redis stream entries as JSONL)")
    p.add_argument("--out", type=Path, default=None, help="write the new head here (a model folder)")
    p.add_argument("--signal", choices=sorted(SIGNALS), default="agreement",
                   help="what says the small tier was not enough: the answers' agreement, or the judge's grade")
    p.add_argument("--agree-below", type=float, default=None, metavar="X",
                   help=f"hard when the signal is below X (default: agreement {DEFAULT_CUT['agreement']}, "
                        f"judge {DEFAULT_CUT['judge']})")
    p.add_argument("--shipped", type=Path, default=Path("models/difficulty"), help="the head to compare with")
    p.add_argument("--heldout-share", type=float, default=0.3, help="share of prompts held out (hash of the prompt)")
    p.add_argument("--l2", type=float, default=None, help="L2 strength (default: picked on validation folds)")
    p.add_argument("--bootstrap", type=int, default=1000, help="resamples for the intervals")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="encoder threads")
    p.add_argument("--embed-cache", type=Path, default=None, help="folder caching embeddings between runs")
    return p


def run_from_shadow(argv: Sequence[str] | None = None) -> int:
    """CLI entry of `gateway train --from-shadow`; returns the exit status."""
    args = parser().parse_args(argv)
    unreadable = [str(p) for p in args.from_shadow if not p.is_file()]
    try:
        if unreadable:
            raise ValueError(f"not a readable file: {', '.join(unreadable)}")
        if not 0 < args.heldout_share < 1:
            raise ValueError(f"--heldout-share must be between 0 and 1, got {args.heldout_share}")
        metrics = from_shadow(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"gateway train --from-shadow: {err}", file=sys.stderr)
        return 2
    print(report(metrics, args.out))
    return 0
