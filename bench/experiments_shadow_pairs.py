"""Issue 22: how many shadow pairs a fresh head needs to beat the shipped one on a team's own traffic.

    .venv/bin/python bench/experiments_shadow_pairs.py [--seeds 3] [--embed-cache DIR] [--bootstrap 1000]

The emulator cannot stand in here: its tiers answer with seeded word salad of the same quality, so the
agreement of two emulated answers says nothing about the prompt. The labeled prompts of
models/difficulty/labels/rubric.jsonl stand in for shadow pairs instead, with two proxies for "the small
tier's answer did not agree with the reference":

  rubric  level >= 4 (a reader judged the small model's answer would be clearly worse): the label the shipped
          head was trained on. Fresh heads learn from N pairs drawn from the train split; both heads are scored
          on the held-out split (1,503 prompts the shipped head never saw). A team whose traffic fails where
          the rubric says it would.
  nll     the small model's surprise at ShareGPT's reference answer in the top quarter (nll_label >= 0.75): how
          far the small tier's own continuation is from the reference's, a direct analogue of low agreement,
          which the shipped head does not predict (README of the labels: AUC 0.47 against the rubric). Pairs
          from the train split's NLL rows, scored on the held-out split's (717). A team whose small tier fails
          where the shipped head does not look.

Each N: `gateway train --from-shadow`'s fit (L2 on validation folds, Platt) on a random N-subset (per seed),
held-out AUC of the fresh head and of the shipped head on the same prompts, and the paired bootstrap
difference (first seed). "Beats" = the mean fresh AUC over seeds exceeds the shipped AUC.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.bench.report import ROOT, md_table
from gateway.classifier.difficulty import open_parts
from gateway.classifier.embedding_cache import cache_key
from gateway.classifier.head import log_chars
from gateway.training.embedding import EmbeddingFile
from gateway.training.quality import auc
from gateway.training.shadow_labels import compare_heads, fit_head_on
from gateway.training.train import features

LABELS = ROOT / "models/difficulty/labels/rubric.jsonl"
SHIPPED = ROOT / "models/difficulty"
SIZES = {"rubric": (100, 200, 400, 800, 1600, 3200, 5826), "nll": (25, 50, 100, 200, 400, 800, 1600, 2783)}


def hard_of(proxy: str, row: dict[str, Any]) -> float | None:
    if proxy == "rubric":
        return float(row["level"] >= 4)
    return None if row.get("nll_label") is None else float(row["nll_label"] >= 0.75)


def run(proxy: str, rows: Sequence[dict[str, Any]], x: np.ndarray, shipped: np.ndarray, seeds: int,
        n_boot: int) -> tuple[list[list[Any]], dict[str, Any]]:
    labels = [hard_of(proxy, row) for row in rows]
    usable = np.array([label is not None for label in labels])
    y = np.array([label or 0.0 for label in labels])
    train = usable & np.array([row["split"] == "train" for row in rows])
    held = usable & ~train & np.array([row["split"] == "heldout" for row in rows])
    shipped_auc = auc(shipped[held], y[held] >= 0.5)
    pool = np.flatnonzero(train)
    keys = np.array([cache_key(row["prompt"]) for row in rows])
    table, first_beat = [], None
    for n in SIZES[proxy]:
        aucs, comparison = [], None
        for seed in range(seeds):
            pick = np.random.default_rng(seed).choice(pool, size=min(n, len(pool)), replace=False)
            if y[pick].sum() < 3 or (1 - y[pick]).sum() < 3:
                continue
            fitted = fit_head_on(x[pick], y[pick], list(keys[pick]), seed=seed)
            scores = fitted.head.predict(x[held])
            aucs.append(auc(scores, y[held] >= 0.5) or 0.0)
            if comparison is None:
                comparison = compare_heads(scores, shipped[held], y[held], n_boot, seed)
        mean = float(np.mean(aucs)) if aucs else float("nan")
        if first_beat is None and shipped_auc is not None and mean > shipped_auc:
            first_beat = n
        diff = comparison or {}
        table.append([n, f"{mean:.3f}", f"{min(aucs):.3f}–{max(aucs):.3f}" if aucs else "",
                      f"{shipped_auc:.3f}",
                      f"{diff.get('diff', 0):+.3f} [{diff['diff_ci'][0]:+.3f}, {diff['diff_ci'][1]:+.3f}]"
                      if diff else "", diff.get("verdict", "")])
    summary = {"proxy": proxy, "train_pool": int(train.sum()), "heldout": int(held.sum()),
               "heldout_hard": int(y[held].sum()), "shipped_auc": shipped_auc, "first_n_beating": first_beat}
    return table, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="random N-subsets per size")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--embed-cache", type=Path, default=None, help="folder caching the prompts' embeddings")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--proxy", choices=sorted(SIZES), action="append", help="default: both")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [json.loads(line) for line in LABELS.open(encoding="utf-8")]
    encoder, head, variant, sha = open_parts(SHIPPED, providers=["CPUExecutionProvider"], threads=args.threads)
    prompts = [row["prompt"] for row in rows]
    emb = EmbeddingFile(args.embed_cache, sha).embed(encoder, prompts, variant)
    x = features(emb, prompts)
    shipped = head.score(emb, log_chars(prompts)).astype(np.float64)
    header = ["pairs N", "fresh head AUC (mean)", "range over seeds", "shipped head AUC",
              "fresh − shipped, seed 0 [95 % CI]", "verdict"]
    for proxy in args.proxy or sorted(SIZES, reverse=True):
        table, summary = run(proxy, rows, x, shipped, args.seeds, args.bootstrap)
        print(f"\n### proxy `{proxy}`: {summary}\n")
        print(md_table(header, table))
    print(f"\n{len(rows):,} prompts, encoder {variant} ({sha[:12]}), {args.seeds} seeds, "
          f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
