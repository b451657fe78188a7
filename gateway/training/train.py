"""`gateway train`: fit the difficulty head on labeled prompts and write its artifacts.

    gateway train --data models/difficulty/labels/sharegpt-nll.jsonl --out models/difficulty
        [--epochs 100] [--l2 X] [--heldout-share 0.2] [--encoder-variant int8] [--eval-variants fp32]
        [--max-tokens 256] [--no-cascade] [--cascade-coverage 0.95] [--cascade-cuts 0.043221,0.1617]

Rows: `prompt` plus `label` in [0, 1], or RouteLLM's `winner` (strong -> 1, weak -> 0, tie -> 0.5);
an unfinalized labeling file (`nll` only) gets rank labels as `labeling --finalize` would give.
`split` (train | heldout) is used when present, else a hash of `id` (or of the prompt) decides.
L2 is picked on hash-sliced validation folds of train (mean AUC, ties by cross-entropy), refit on
all of train and Platt-scaled on its out-of-fold scores, so the score estimates P(label >= hard_at)
(a monotone map: the ranking and AUC are those of the soft-target fit); `--hard-at` moves that cut
(0.75 for rubric levels: hard = level >= 4). `--eval-variants` scores
the held-out set with other encoder variants; one within 0.01 AUC is recorded as compatible
(`load_classifier` serves only compatible variants, e.g. fp16 on CUDA).
`--max-tokens` is the encoder's head + tail token window (recorded in metrics.json, used by the
gateway). Then the cascade's cheap scorer is fitted to the head's scores (gateway.training.cascade;
`--no-cascade` skips it and removes a stale cascade.json); `--cascade-cuts` only choose where its
report is taken. Writes head.onnx, metrics.json, thresholds.json, calibration.png and cascade.json;
train-time only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.cascade import CASCADE_FILE, load_word_table
from gateway.classifier.difficulty import DEFAULT_MAX_TOKENS, file_sha256
from gateway.classifier.embedding_cache import cache_key
from gateway.classifier.encoder import DIFFICULTY, GRAPHS, VARIANTS, EncoderSession, Graph, default_model_path, file_name
from gateway.classifier.head import log_chars
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.cascade import DEFAULT_COVERAGE, CascadeFit, fit_cascade
from gateway.training.embedding import EmbeddingFile
from gateway.training.fit import HeadParams, fit_head, newton_logistic
from gateway.training.labeling import rank_labels
from gateway.training.language import guess_language
from gateway.training.quality import auc, evaluate, write_calibration_plot

L2_GRID = (1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
AUC_TOLERANCE = 0.005  # validation AUCs this close count as a tie, broken by cross-entropy
WINNER_LABELS = {"strong": 1.0, "weak": 0.0, "tie": 0.5}
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LabeledPrompt:
    key: str  # the row's id, else the hash of its prompt
    prompt: str
    label: float
    split: str
    language: str


def hash_split(key: str, heldout_share: float) -> str:
    """"heldout" for ~heldout_share of keys (the id's `_N` part suffix ignored), else "train"."""
    stem = key.rsplit("_", 1)[0] if "_" in key else key
    bucket = int.from_bytes(hashlib.sha256(stem.encode()).digest()[:8], "big") % 100
    return "heldout" if bucket < round(heldout_share * 100) else "train"


def row_label(row: dict[str, Any], where: str) -> float | None:
    """`label` in [0, 1], or `winner` mapped to 1 / 0 / 0.5; None when the row has neither."""
    if row.get("label") is not None:
        label = float(row["label"])
        if not 0.0 <= label <= 1.0:
            raise ValueError(f"{where}: label {label} is outside [0, 1]")
        return label
    if "winner" in row:
        winner = str(row["winner"]).strip().lower()
        key = "tie" if winner.startswith("tie") else winner
        if key not in WINNER_LABELS:
            raise ValueError(f"{where}: winner {row['winner']!r} is not strong, weak or tie")
        return WINNER_LABELS[key]
    return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn last line (a file still being written) is skipped."""
    lines = path.read_text(encoding="utf-8").split("\n")  # not splitlines(): prompts hold U+2028 etc.
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if n >= len(lines) - 1 and not "".join(lines[n:]).strip():
                break  # the torn last line of a file still being written
            raise ValueError(f"{path}:{n}: not JSON ({err})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{n}: a row needs a string `prompt`")
        rows.append(row)
    return rows


def load_labeled(path: Path, heldout_share: float = 0.2) -> tuple[list[LabeledPrompt], str]:
    """Labeled prompts of `path` and where their labels came from (label | winner | nll-rank)."""
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path} has no rows")
    labels = [row_label(r, f"{path}:{i + 1}") for i, r in enumerate(rows)]
    source = "winner" if all("winner" in r and r.get("label") is None for r in rows) else "label"
    if all(label is None for label in labels) and all("nll" in r for r in rows):
        labels, source = list(rank_labels([float(r["nll"]) for r in rows])), "nll-rank"
    if (missing := [i + 1 for i, label in enumerate(labels) if label is None]):
        raise ValueError(f"{path}: rows {missing[:5]} have no label, winner or nll")
    out = []
    for row, label in zip(rows, labels, strict=True):
        key = str(row.get("id") or cache_key(row["prompt"]))
        split = row.get("split")
        if split not in ("train", "heldout"):
            split = hash_split(key, heldout_share)
        language = str(row.get("language") or guess_language(row["prompt"]))
        out.append(LabeledPrompt(key, row["prompt"], float(label or 0.0), split, language))
    return out, source


def features(embeddings: npt.NDArray[np.float32], texts: Sequence[str]) -> F64:
    """The head's input row per prompt: embedding (384) then log1p(chars)."""
    return np.hstack([embeddings.astype(np.float64), log_chars(texts).astype(np.float64)])


def encoder_path(variant: str, directory: Path | None, graph: Graph = DIFFICULTY) -> Path:
    """The encoder file of `variant` of `graph`: in `directory` when given, else the shipped one."""
    if directory is None:
        return default_model_path(variant, graph)
    path = directory / file_name(variant, graph)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (see models/minilm-l6-v2/MODEL_CARD.md to export it)")
    return path


def fold_of(key: str, seed: int, folds: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "big") % folds


def out_of_fold(x: F64, y: F64, fold: npt.NDArray[np.int64], l2: float, standardize: str, max_iter: int) -> F64:
    """Each train row's score by the head fitted on the other folds."""
    oof = np.zeros(len(y))
    for f in np.unique(fold):
        head, _ = fit_head(x[fold != f], y[fold != f], l2, standardize=standardize, max_iter=max_iter)
        oof[fold == f] = head.predict(x[fold == f])
    return oof


def select_l2(
    x: F64, y: F64, fold: npt.NDArray[np.int64], grid: Sequence[float], standardize: str, max_iter: int,
    hard_at: float = 0.5,
) -> tuple[float, F64, list[dict[str, float | None]]]:
    """The L2 of `grid` to use, its out-of-fold scores, and the search table.

    Each L2 gets the mean AUC (hard = label >= hard_at) over the validation folds (per fold: each
    fold's model has its own offset) and the out-of-fold cross-entropy against the soft labels. Among the L2s within
    AUC_TOLERANCE of the best AUC (noise at this size), the lowest cross-entropy wins.
    """
    table: list[dict[str, float | None]] = []
    runs: list[tuple[float, float, float, F64]] = []
    for l2 in grid:
        oof = out_of_fold(x, y, fold, l2, standardize, max_iter)
        p = np.clip(oof, 1e-7, 1 - 1e-7)
        bce = float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))
        per_fold = [auc(oof[fold == f], y[fold == f] >= hard_at) for f in np.unique(fold)]
        known = [a for a in per_fold if a is not None]
        val_auc = round(float(np.mean(known)), 4) if known else None
        table.append({"l2": l2, "val_auc": val_auc, "val_bce": round(bce, 5)})
        runs.append((val_auc or 0.0, bce, l2, oof))
    top = max(r[0] for r in runs)
    _, _, l2, oof = min((r for r in runs if r[0] >= top - AUC_TOLERANCE), key=lambda r: r[1])
    return l2, oof, table


def platt(scores: F64, hard: npt.NDArray[np.bool_]) -> tuple[float, float]:
    """(a, c) so that sigmoid(a * logit(score) + c) estimates P(hard): a monotone recalibration."""
    p = np.clip(scores, 1e-9, 1 - 1e-9)
    z = np.column_stack([np.log(p / (1 - p)), np.ones(len(p))])
    theta, _ = newton_logistic(z, hard.astype(np.float64), np.array([1.0, 0.0]), np.array([1e-6, 0.0]))
    return float(theta[0]), float(theta[1])


WAYS_IN = """every way in:
  --data FILE                   labeled prompts (label in [0, 1], or RouteLLM's winner): the difficulty head
                                (these options)
  --from-shadow PAIRS.jsonl...  the gateway's own shadow pairs (`gateway serve --shadow-pairs`): a difficulty
                                head labeled by the answers' agreement or the judge's grade
                                (`gateway train --from-shadow PAIRS.jsonl --help`)
  --from-outcomes FILE...       measured outcomes (prompt + per-model scores in [0, 1], optional cost, as in
                                ../shared/outcomes/), shadow pairs, and /v1/feedback (the request log's
                                `feedback` lines), in any mix: the quality router that quality_floor routes on
                                (--out default: models/router, the shipped router, replaced only with --force;
                                `gateway train --from-outcomes FILE --help`)"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway train", description="Fit the prompt-difficulty head (--data), or see "
                                "below for the other ways in.", epilog=WAYS_IN,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="JSONL: prompt + label in [0,1] or winner")
    p.add_argument("--out", type=Path, required=True, help="model folder to write (e.g. models/difficulty)")
    p.add_argument("--epochs", type=int, default=100, help="maximum Newton iterations")
    p.add_argument("--l2", type=float, default=None, help="L2 strength (default: picked on validation folds)")
    p.add_argument("--heldout-share", type=float, default=0.2, help="hash split share when rows lack `split`")
    p.add_argument("--encoder-variant", choices=sorted(VARIANTS), default="int8")
    p.add_argument("--encoder-graph", choices=sorted(GRAPHS), default=DIFFICULTY.name,
                   help="encoder graph whose output the head reads (difficulty: 4 layers; sentence: 6)")
    p.add_argument("--eval-variants", default="", help="other encoder variants to evaluate the head with")
    p.add_argument("--encoder-dir", type=Path, default=None, help="folder of model.<variant>.onnx (default: shipped)")
    p.add_argument("--standardize", choices=("all", "length"), default="all", help="features to standardize")
    p.add_argument("--val-folds", type=int, default=5, help="validation slices of train for picking L2")
    p.add_argument("--calibration", choices=("platt", "none"), default="platt",
                   help="platt: rescale the score to P(label >= --hard-at) on out-of-fold scores (ranking unchanged)")
    p.add_argument("--hard-at", type=float, default=0.5,
                   help="hard = label >= this, for AUC and Platt scaling (rubric levels: 0.75 = level >= 4)")
    p.add_argument("--target", choices=("label", "hard"), default="label",
                   help="fit the soft label, or hard = label >= --hard-at as a 0/1 target (rubric levels)")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation slices")
    p.add_argument("--threads", type=int, default=2, help="encoder threads")
    p.add_argument("--embed-cache", type=Path, default=None, help="folder caching embeddings between runs")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="the encoder's token window: [CLS] + first and last (max-tokens - 2) / 2 tokens + [SEP]")
    p.add_argument("--cascade", action=argparse.BooleanOptionalAction, default=True,
                   help="fit the cascade's cheap scorer (cascade.json) to the head's scores")
    p.add_argument("--cascade-coverage", type=float, default=DEFAULT_COVERAGE,
                   help="share of validation prompts whose full score lies in the cheap score's interval")
    p.add_argument("--cascade-cuts", default="0.043221,0.1617",
                   help="band cuts at which the cascade's agreement is reported (not fitted on)")
    return p


def run_train(argv: Sequence[str] | None = None) -> int:
    """CLI entry of `gateway train`; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        metrics = train(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"gateway train: {err}", file=sys.stderr)
        return 2
    print(report(metrics))
    return 0


@dataclass(frozen=True, slots=True)
class Fitted:
    head: HeadParams
    l2: float
    iterations: int
    search: list[dict[str, float | None]]
    platt: tuple[float, float] | None


def fit(x: F64, y: F64, keys: Sequence[str], args: argparse.Namespace) -> Fitted:
    """Pick L2 on validation folds of train, fit on all of train, then (optionally) Platt-scale to P(hard)."""
    if args.val_folds < 2:
        raise ValueError(f"--val-folds must be >= 2, got {args.val_folds}")
    fold = np.array([fold_of(k, args.seed, args.val_folds) for k in keys])
    grid = [args.l2] if args.l2 is not None else L2_GRID
    l2, oof, search = select_l2(x, y, fold, grid, args.standardize, args.epochs, args.hard_at)
    head, iterations = fit_head(x, y, l2, standardize=args.standardize, max_iter=args.epochs)
    if args.calibration == "none":
        return Fitted(head, l2, iterations, search, None)
    a, c = platt(oof, y >= args.hard_at)  # monotone: the ranking (AUC) is unchanged
    return Fitted(HeadParams(head.weights * a, head.bias * a + c, head.mean, head.std), l2, iterations, search, (a, c))


def fit_target(labels: F64, args: argparse.Namespace) -> F64:
    """What the head fits: the soft labels, or 0/1 for hard = label >= --hard-at."""
    if getattr(args, "target", "label") == "hard":
        hard: F64 = (labels >= args.hard_at).astype(np.float64)
        return hard
    return labels


def train(args: argparse.Namespace) -> dict[str, Any]:
    """Embed, pick L2, fit, evaluate, export; returns metrics.json's content."""
    started = time.perf_counter()
    rows, source = load_labeled(args.data, args.heldout_share)
    held = [r for r in rows if r.split == "heldout"]
    if len(rows) - len(held) < 10 or len(held) < 2:
        raise ValueError(f"need >= 10 train and >= 2 heldout rows, got {len(rows) - len(held)} and {len(held)}")
    graph = GRAPHS[args.encoder_graph]
    model_path = encoder_path(args.encoder_variant, args.encoder_dir, graph)
    sha = file_sha256(model_path)
    encoder = EncoderSession(model_path, threads=args.threads, tokenizer=PromptTokenizer(args.max_tokens))
    emb = EmbeddingFile(args.embed_cache, sha, args.max_tokens).embed(encoder, [r.prompt for r in rows],
                                                                      args.encoder_variant)
    x, y = features(emb, [r.prompt for r in rows]), np.array([r.label for r in rows])
    tr = np.array([r.split == "train" for r in rows])
    embed_s = time.perf_counter() - started
    fitted = fit(x[tr], fit_target(y[tr], args), [r.key for r in rows if r.split == "train"], args)
    scores = fitted.head.predict(x[~tr])
    quality = evaluate(scores, y[~tr], [r.language for r in held], x[~tr, -1], hard_at=args.hard_at)
    encoders: dict[str, dict[str, Any]] = {args.encoder_variant: {"file": model_path.name, "sha256": sha}}
    for variant in [v for v in args.eval_variants.split(",") if v and v != args.encoder_variant]:
        encoders[variant] = evaluate_variant(encoder_path(variant, args.encoder_dir, graph), fitted.head, held, scores, args)
        encoders[variant]["compatible"] = (encoders[variant]["heldout_auc"] or 0.0) >= (quality["heldout"]["auc"] or 0.0) - 0.01
    metrics: dict[str, Any] = {
        "model": "difficulty-head",
        "score": "P(hard) after Platt scaling" if fitted.platt else "expected label (soft-target logistic)",
        "hard_at": args.hard_at,
        "features": ["embedding[384]", "log_chars = log1p(len(prompt))"],
        "encoder": {
            "graph": graph.name, "layers": graph.layers, "pooled": list(graph.pooled), "max_tokens": args.max_tokens,
            "variant": args.encoder_variant, "file": model_path.name, "sha256": sha, "provider": encoder.provider,
        },
        "compatible_encoders": encoders,
        "data": {"path": str(args.data), "sha256": file_sha256(args.data), "label_source": source},
        "counts": {"rows": len(rows), "train": int(tr.sum()), "heldout": len(held), "val_folds": args.val_folds},
        **quality,
        "training": {
            "l2": fitted.l2, "l2_search": fitted.search, "standardize": args.standardize, "target": args.target,
            "platt": fitted.platt and [round(v, 6) for v in fitted.platt],
            "newton_iterations": fitted.iterations, "max_iterations": args.epochs, "seed": args.seed,
            "embed_seconds": round(embed_s, 2), "embed_cache_used": args.embed_cache is not None,
            "total_seconds": round(time.perf_counter() - started, 2),
        },
    }
    onnx_bytes = fitted.head.to_onnx({"encoder_graph": graph.name, "encoder_variant": args.encoder_variant, "encoder_sha256": sha})
    cascade = None
    if args.cascade:
        cascade = train_cascade(rows, fitted.head.predict(x), encoder.tokenizer, hashlib.sha256(onnx_bytes).hexdigest(), args)
        metrics["cascade"] = {
            "file": CASCADE_FILE, "coverage": args.cascade_coverage, "l2": cascade.l2, "l2_search": cascade.search,
            "validation": cascade.validation, "heldout": cascade.heldout,
        }
        metrics["training"]["total_seconds"] = round(time.perf_counter() - started, 2)
    write_artifacts(args.out, onnx_bytes, metrics, scores, held, args.hard_at, cascade)
    return metrics


def train_cascade(rows: Sequence[LabeledPrompt], full: F64, tokenizer: PromptTokenizer, head_sha256: str,
                  args: argparse.Namespace) -> CascadeFit:
    """The cascade's cheap scorer fitted to the head's scores `full` (all rows), on the head's validation folds."""
    cuts = [float(c) for c in str(args.cascade_cuts).split(",") if c.strip()]
    train_keys = [r.key for r in rows if r.split == "train"]
    return fit_cascade(
        [tokenizer.ids(r.prompt) for r in rows], [len(r.prompt) for r in rows], full,
        [r.split == "train" for r in rows], [fold_of(k, args.seed, args.val_folds) for k in train_keys],
        table=load_word_table(), max_tokens=args.max_tokens, head_sha256=head_sha256,
        coverage=args.cascade_coverage, cuts=cuts, hard=[r.label >= args.hard_at for r in rows],
    )


def evaluate_variant(
    path: Path, head: HeadParams, held: Sequence[LabeledPrompt], reference: F64, args: argparse.Namespace
) -> dict[str, Any]:
    """Held-out AUC of the fitted head on embeddings from another encoder file."""
    texts = [r.prompt for r in held]
    sha = file_sha256(path)
    encoder = EncoderSession(path, threads=args.threads, tokenizer=PromptTokenizer(args.max_tokens))
    emb = EmbeddingFile(args.embed_cache, sha, args.max_tokens).embed(encoder, texts, path.stem)
    scores = head.predict(features(emb, texts))
    return {
        "file": path.name, "sha256": sha,
        "heldout_auc": auc(scores, np.array([r.label >= args.hard_at for r in held])),
        "max_abs_score_diff": round(float(np.abs(scores - reference).max()), 5),
    }


def write_artifacts(
    out: Path, onnx_bytes: bytes, metrics: dict[str, Any], scores: F64, held: Sequence[LabeledPrompt], hard_at: float = 0.5,
    cascade: CascadeFit | None = None,
) -> None:
    """head.onnx, metrics.json, thresholds.json (held-out score quantiles), calibration.png and cascade.json
    (removed when no cascade was fitted: it would belong to another head)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "head.onnx").write_bytes(onnx_bytes)
    if cascade is not None:
        body = cascade.model.to_json() | {"validation": cascade.validation, "heldout": cascade.heldout}
        (out / CASCADE_FILE).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    else:
        (out / CASCADE_FILE).unlink(missing_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    qs = np.linspace(0.0, 1.0, 101)
    thresholds = {
        "source": "heldout scores", "n": len(scores),
        "quantiles": {f"{q:.2f}": round(float(v), 6) for q, v in zip(qs, np.quantile(scores, qs), strict=True)},
    }
    (out / "thresholds.json").write_text(json.dumps(thresholds, indent=2) + "\n", encoding="utf-8")
    write_calibration_plot(out / "calibration.png", scores, np.array([r.label for r in held]), metrics, hard_at)


def report(m: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    h = m["heldout"]
    lines = [
        f"encoder {m['encoder']['variant']} ({m['encoder']['sha256'][:12]}), labels from {m['data']['label_source']}",
        f"rows {m['counts']['rows']}: train {m['counts']['train']}, heldout {m['counts']['heldout']}",
        f"l2 {m['training']['l2']:g} ({m['training']['newton_iterations']} Newton iterations, "
        f"{m['training']['total_seconds']:.1f} s)",
        f"heldout AUC {h['auc']}  Brier {h['brier']}  Spearman {h['spearman']}  "
        f"(log_chars alone: AUC {h['baseline_auc_log_chars']})",
    ]
    lines += [f"  {lang}: AUC {v['auc']} (n={v['n']})" for lang, v in m["per_language"].items() if v["auc"] is not None]
    lines += [f"  with {v}: AUC {e['heldout_auc']}" for v, e in m["compatible_encoders"].items() if "heldout_auc" in e]
    if (c := m.get("cascade")) is not None:
        v, h = c["validation"], c["heldout"]
        lines.append(
            f"cascade (coverage {c['coverage']}, cuts {h['cuts']}): decides {h['decided_share']:.1%} of heldout prompts "
            f"({h['decided_token_share']:.1%} of their tokens) without the encoder, band agreement {h['band_agreement']:.2%}"
            f", AUC {h.get('auc_cascade')} (full {h.get('auc_full')}); validation: {v['decided_share']:.1%}, "
            f"agreement {v['band_agreement']:.2%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return run_train(argv)


if __name__ == "__main__":
    sys.exit(main())
