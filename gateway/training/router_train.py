"""`gateway train --from-outcomes FILE...`: fit the quality router on measured outcomes and write models/router.

    gateway train --from-outcomes ../shared/outcomes/*.jsonl [--out models/router --force] [--embed-cache .cache/router]
        [--l2 3] [--alpha 0.25] [--gate 0.2]

Reads the outcome JSONL shape (gateway.training.outcomes), embeds the prompts with the difficulty classifier's
encoder (the embedding the gateway computes anyway), fits one logistic output per measured model
(gateway.training.router_fit.fit_linear) on every row, keeps the rows' embeddings and outcomes for the kNN half
of the blend, records the rubric gate (gateway.classifier.quality), and writes what gateway.classifier.quality serves:
router.npz (arrays), metrics.json (encoder, features, models, counts, data hashes, and the held-out
measurements when the bench has put them there) and SHA256SUMS. The held-out evaluation is
bench/routing_outcomes.py: it fits the same way on training folds only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.classifier.difficulty import file_sha256
from gateway.classifier.prompt_features import NAMES
from gateway.classifier.quality_head import ARRAYS, HEAD_FILE, Neighbours
from gateway.training.export import update_sums
from gateway.training.outcomes import OutcomeRow, read_outcomes
from gateway.training.router_data import DIFFICULTY_DIR, OutcomeSet, encoder_of, load_outcome_set
from gateway.training.router_fit import LinearRouter, fit_linear

DEFAULT_L2 = 3.0
KNN_K = 25
# The blend weight and the rubric gate's constant: the setting with the best mean APGR on validation folds of the
# hash split's training rows among those ordering >= 96 % of the hand-written pairs (tests/data/
# difficulty_pairs.jsonl; 95 % required) by both the 7B -> 51B and the 7B -> 49B gain (bench/routing_outcomes.py,
# "Selection"). kNN scores better on validation but orders too few pairs: alpha 1 keeps no neighbour table.
DEFAULT_ALPHA = 1.0
DEFAULT_GATE = 0.5
METRICS_FILE = "metrics.json"
SHIPPED_ROUTER = DIFFICULTY_DIR.parent / "router"  # the repository's models/router


def export_router(router: LinearRouter, out_dir: Path, metrics: dict[str, Any], gate_h0: float = 0.0,
                  neighbours: Neighbours | None = None) -> None:
    """router.npz + metrics.json, and their lines of SHA256SUMS (other files' lines kept)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "router.tmp.npz"
    arrays: dict[str, Any] = {
        "models": np.array(router.models), "mean": router.mean.astype(np.float32), "std": router.std.astype(np.float32),
        "weights": router.weights.astype(np.float32), "bias": router.bias.astype(np.float32),
        "gate_h0": np.array(gate_h0, np.float32), **(neighbours.arrays() if neighbours is not None else {}),
    }
    np.savez(tmp, **arrays)
    tmp.replace(out_dir / ARRAYS)
    previous = out_dir / METRICS_FILE
    if previous.is_file() and "evaluation" not in metrics:
        old = json.loads(previous.read_text(encoding="utf-8"))
        if "evaluation" in old and same_procedure(old, metrics):  # the bench's numbers still describe this fit
            metrics["evaluation"] = old["evaluation"]
    previous.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    update_sums(out_dir, [ARRAYS, METRICS_FILE])


def same_procedure(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """The same data files, encoder, gate and training options (the fit's duration aside)."""
    def key(m: dict[str, Any]) -> list[Any]:
        training = {k: v for k, v in (m.get("training") or {}).items() if k != "seconds"}
        return [(m.get("data") or {}).get("files"), m.get("encoder"), (m.get("gate") or {}).get("h0"), training]
    return key(old) == key(new)


def describe(rows: Sequence[OutcomeRow], data: OutcomeSet, paths: Sequence[Path]) -> dict[str, Any]:
    """Counts per source and per model, and each input file's SHA-256."""
    return {
        "files": {p.name: file_sha256(p) for p in paths},
        "rows": len(rows),
        "by_source": dict(Counter(r.source for r in rows)),
        "outcomes_per_model": {m: int(np.sum(~np.isnan(data.column(m)))) for m in data.models},
        "mean_score_per_model": {m: round(float(np.nanmean(data.column(m))), 4) for m in data.models},
    }


def gate_of(difficulty_dir: Path, out_dir: Path, gate_h0: float) -> dict[str, Any]:
    """metrics.json's `gate`: the difficulty head's folder relative to the router folder itself (`head`: the pair
    moves together; gateway.classifier.quality also finds the head in the repository's models/), and its SHA-256."""
    return {"h0": gate_h0, "head": Path(os.path.relpath(difficulty_dir.resolve(), out_dir.resolve())).as_posix(),
            "head_sha256": file_sha256(difficulty_dir / HEAD_FILE),
            "formula": "quality = 1 - h / (h + h0) * (1 - measured), h = the difficulty head's P(hard)"}


def train_router(
    rows: Sequence[OutcomeRow], out_dir: Path, *, l2: float = DEFAULT_L2, gate_h0: float = DEFAULT_GATE,
    alpha: float = DEFAULT_ALPHA, k: int = KNN_K, cache_dir: Path | None = None,
    difficulty_dir: Path = DIFFICULTY_DIR, paths: Sequence[Path] = (), threads: int = 1,
) -> dict[str, Any]:
    """Fit on all `rows` and export to `out_dir`; returns what metrics.json holds."""
    started = time.perf_counter()
    if len(rows) < 20:
        raise ValueError(f"need >= 20 outcome rows to fit a router, got {len(rows)}")
    data = load_outcome_set(rows, cache_dir=cache_dir, difficulty_dir=difficulty_dir, threads=threads)
    router = fit_linear(data.x, data.targets, data.models, l2)
    neighbours = None if alpha >= 1 else Neighbours(data.embeddings, data.targets.astype(np.float32), k, alpha)
    enc = encoder_of(difficulty_dir)
    metrics: dict[str, Any] = {
        "model": "quality-router",
        "score": "expected score in [0, 1] of each measured model on the prompt: alpha * logistic output + "
                 "(1 - alpha) * mean of the k nearest measured prompts, then the rubric gate",
        "models": list(router.models),
        "encoder": {k: enc[k] for k in ("graph", "layers", "pooled", "max_tokens", "variant", "file", "sha256")},
        "features": {"embedding": 384, "names": list(NAMES)},
        "gate": gate_of(difficulty_dir, out_dir, gate_h0),
        "training": {"l2": l2, "fit": "fit_linear (per-model logistic, soft targets, damped Newton)",
                     "blend_alpha": alpha, "knn_k": k,
                     "seconds": round(time.perf_counter() - started, 2)},
        "data": describe(rows, data, paths),
    }
    export_router(router, out_dir, metrics, gate_h0, neighbours)
    return metrics


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway train --from-outcomes", description="Fit the quality router.")
    p.add_argument("--from-outcomes", dest="files", type=Path, nargs="+", required=True, metavar="FILE",
                   help="outcome JSONL files: prompt, scores {model: [0, 1]}, optional task/source/cost_usd")
    p.add_argument("--out", type=Path, default=Path("models/router"),
                   help="model folder to write (default: %(default)s; the shipped router is replaced only with --force)")
    p.add_argument("--force", action="store_true",
                   help="replace the shipped router (models/router of this repository) when --out names it")
    p.add_argument("--l2", type=float, default=DEFAULT_L2, help="L2 strength of each logistic output")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help="weight of the logistic outputs in the blend with kNN (1: no kNN table)")
    p.add_argument("--gate", type=float, default=DEFAULT_GATE,
                   help="rubric gate constant h0: quality = 1 - h/(h+h0) * (1 - measured); 0 turns it off")
    p.add_argument("--embed-cache", type=Path, default=None, help="folder caching embeddings between runs")
    p.add_argument("--difficulty", type=Path, default=DIFFICULTY_DIR,
                   help="difficulty model whose encoder the router shares")
    p.add_argument("--threads", type=int, default=1, help="encoder threads")
    return p


def shipped_router_refusal(out: Path, force: bool) -> str | None:
    """Why `--out` may not be written: it is the router this repository ships (None: go ahead)."""
    if force or not (out / METRICS_FILE).is_file() or out.resolve() != SHIPPED_ROUTER.resolve():
        return None
    return (f"{out} is the shipped router: pass --force to replace it, or --out another folder (e.g. "
            "models/router-ours, then `quality_predictor: models/router-ours` in the policy)")


def run_from_outcomes(argv: Sequence[str] | None = None) -> int:
    """CLI entry; 0 done, 2 bad arguments or data."""
    args = parser().parse_args(argv)
    if (refusal := shipped_router_refusal(args.out, args.force)) is not None:
        print(f"gateway train: {refusal}", file=sys.stderr)
        return 2
    try:
        rows = read_outcomes(args.files)
        metrics = train_router(rows, args.out, l2=args.l2, gate_h0=args.gate, alpha=args.alpha, cache_dir=args.embed_cache, difficulty_dir=args.difficulty,
                               paths=args.files, threads=args.threads)
    except (ValueError, FileNotFoundError) as err:
        print(f"gateway train: {err}", file=sys.stderr)
        return 2
    data = metrics["data"]
    print(f"fitted {len(metrics['models'])} model outputs on {data['rows']} prompts {data['by_source']} "
          f"in {metrics['training']['seconds']} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_from_outcomes())
