"""Does fine-tuning the difficulty encoder beat the shipped frozen-encoder head? Validation folds only.

    .venv/bin/python bench/difficulty_finetune.py [--folds 0,1,2] [--modes full,lora] [--epochs 3]

On each validation fold of the train split (the folds `gateway train` picks L2 on: `fold_of(id,
seed, 5)`), three heads are fitted on the other folds and scored on it:

- frozen: the shipped procedure, soft-target logistic regression (L2 = --l2) on the difficulty
  graph's features (layers 3 + 4 pooled, + log_chars), computed by torch in float32;
- full:   the same graph and head fine-tuned end to end (LP-FT: the head starts from the frozen
  fit), soft-label BCE, AdamW, linear warm-up over 10 % then decay, --epochs epochs;
- lora:   as full, but the encoder's weights stay frozen and rank --lora-rank adapters on every
  linear layer of the 4 transformer layers learn (what a committed adapter file would hold).

Prints one row per fold with the validation AUC after each epoch, then the mean. The held-out
split is never read. Needs the `train` extra; about 2 minutes per fine-tuning epoch on 2 threads here, 35 minutes for 3 folds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.encoder import DIFFICULTY
from gateway.classifier.head import log_chars
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.export import load_torch_encoder
from gateway.training.fit import fit_head
from gateway.training.labeling import rank_labels
from gateway.training.quality import auc
from gateway.training.train import fold_of, read_jsonl

LABELS = Path(__file__).resolve().parents[1] / "models" / "difficulty" / "labels" / "sharegpt-nll.jsonl"
F64 = npt.NDArray[np.float64]


def lora_linear(base: Any, rank: int) -> Any:
    """A torch module computing `base(x) + x A^T B^T`, A random, B zero (so it starts as `base`)."""
    import torch

    class Adapted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.base = base
            self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) / base.in_features**0.5)
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x: Any) -> Any:
            return self.base(x) + (x @ self.a.T) @ self.b.T

    return Adapted()


def add_adapters(encoder: Any, rank: int) -> None:
    """Freeze `encoder` and put rank-`rank` adapters on each transformer layer's six linear maps."""
    for param in encoder.parameters():
        param.requires_grad_(False)
    for layer in encoder.bert.encoder.layer:
        attn = layer.attention
        for owner, name in ((attn.self, "query"), (attn.self, "key"), (attn.self, "value"), (attn.output, "dense"),
                            (layer.intermediate, "dense"), (layer.output, "dense")):
            setattr(owner, name, lora_linear(getattr(owner, name), rank))


class Study:
    """The labeled rows, their soft labels and the tokenizer, shared by every fold and mode."""

    def __init__(self, args: argparse.Namespace) -> None:
        rows = read_jsonl(LABELS)
        self.args = args
        self.train_rows = [r for r in rows if r["split"] == "train"]
        self.prompts = [str(r["prompt"]) for r in self.train_rows]
        ranked = np.array(rank_labels([float(r["nll"]) for r in rows]))  # ranks over the whole file, as shipped
        self.y = ranked[[i for i, r in enumerate(rows) if r["split"] == "train"]]
        self.length = log_chars(self.prompts)[:, 0].astype(np.float64)
        self.tok = PromptTokenizer(256)

    def features(self, encoder: Any, ids: Sequence[int]) -> F64:
        """(len(ids), 385): the encoder's output (eval mode) + log_chars, length-sorted batches of 32."""
        import torch

        encoder.eval()
        order = sorted(ids, key=lambda i: len(self.prompts[i]))
        out: dict[int, npt.NDArray[np.float32]] = {}
        with torch.inference_mode():
            for k in range(0, len(order), 32):
                chunk = order[k : k + 32]
                feed = {n: torch.from_numpy(v) for n, v in self.tok.encode_batch([self.prompts[i] for i in chunk]).items()}
                out.update(zip(chunk, encoder(**feed).numpy()))
        return np.column_stack([np.stack([out[i] for i in ids]), self.length[list(ids)]]).astype(np.float64)

    def fold(self, fold: int, mode: str) -> list[float]:
        """Validation AUCs of `mode` on `fold`: [frozen] or [after epoch 1, 2, ...]."""
        import torch

        torch.manual_seed(0)
        fold_ids = np.array([fold_of(str(r["id"]), self.args.seed, 5) for r in self.train_rows])
        fit_ids, val_ids = np.flatnonzero(fold_ids != fold).tolist(), np.flatnonzero(fold_ids == fold).tolist()
        encoder = load_torch_encoder(DIFFICULTY)
        frozen, _ = fit_head(self.features(encoder, fit_ids), self.y[fit_ids], self.args.l2)
        head = torch.nn.Linear(len(frozen.weights), 1).double()  # on standardized features, as HeadParams
        with torch.no_grad():
            head.weight[:] = torch.from_numpy(frozen.weights)
            head.bias[:] = frozen.bias
        shift, scale = torch.from_numpy(frozen.mean), torch.from_numpy(frozen.std)

        def val_auc() -> float:
            x = torch.from_numpy(self.features(encoder, val_ids))
            with torch.no_grad():
                scores = head((x - shift) / scale).squeeze(-1).numpy()
            return float(auc(scores, self.y[val_ids] >= 0.5) or 0.0)

        if mode == "frozen":
            return [val_auc()]
        if mode == "lora":
            add_adapters(encoder, self.args.lora_rank)
        lr = self.args.lora_lr if mode == "lora" else self.args.lr
        opt = torch.optim.AdamW([
            {"params": [p for p in encoder.parameters() if p.requires_grad], "lr": lr, "weight_decay": 0.01},
            {"params": head.parameters(), "lr": self.args.head_lr, "weight_decay": 0.0},
        ])
        steps = self.args.epochs * -(-len(fit_ids) // self.args.batch)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (0.1 * steps)) * max(0.0, (steps - s) / steps))
        rng = np.random.default_rng(0)
        aucs = []
        for _ in range(self.args.epochs):
            encoder.train()
            jitter = {i: len(self.prompts[i]) * (1 + 0.1 * rng.random()) for i in fit_ids}  # length buckets, shuffled
            order = sorted(fit_ids, key=jitter.__getitem__)
            batches = [order[k : k + self.args.batch] for k in range(0, len(order), self.args.batch)]
            rng.shuffle(batches)
            for batch in batches:
                feed = {n: torch.from_numpy(v) for n, v in self.tok.encode_batch([self.prompts[i] for i in batch]).items()}
                x = torch.cat([encoder(**feed).double(), torch.from_numpy(self.length[batch])[:, None]], dim=1)
                logit = head((x - shift) / scale).squeeze(-1)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, torch.from_numpy(self.y[batch]))
                opt.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
                torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
                opt.step()
                sched.step()
            aucs.append(val_auc())
        return aucs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folds", default="0,1,2", help="validation folds (of 5) to run")
    parser.add_argument("--seed", type=int, default=0, help="fold seed (gateway train's --seed)")
    parser.add_argument("--modes", default="full,lora", help="fine-tuning modes besides frozen: full, lora")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-5, help="encoder learning rate, full")
    parser.add_argument("--lora-lr", type=float, default=1e-3, help="adapter learning rate, lora")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--l2", type=float, default=0.3, help="frozen head's L2 (the shipped head's)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    study = Study(args)
    modes = ["frozen", *[m for m in args.modes.split(",") if m]]
    folds = [int(f) for f in args.folds.split(",")]
    started = time.perf_counter()
    table: dict[str, list[float]] = {m: [] for m in modes}
    print(f"| fold | {' | '.join(modes)} |\n| ---: |{' ---: |' * len(modes)}", flush=True)
    for fold in folds:
        cells = []
        for mode in modes:
            aucs = study.fold(fold, mode)
            table[mode].append(aucs[-1])
            cells.append(" → ".join(f"{a:.4f}" for a in aucs))
            print(f"fold {fold} {mode} done, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        print(f"| {fold} | {' | '.join(cells)} |", flush=True)
    means = " | ".join(f"{np.mean(table[m]):.4f} ({np.mean(table[m]) - np.mean(table['frozen']):+.4f})" for m in modes)
    print(f"| mean | {means} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
