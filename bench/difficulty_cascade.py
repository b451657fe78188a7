"""The difficulty cascade against the full model: held-out routing quality, sanity pairs, cold throughput on one core.

    .venv/bin/python bench/difficulty_cascade.py [--model models/difficulty] [--baseline DIR]
        [--cuts 0.043221,0.1617] [--prompts 300] [--rounds 3] [--concurrency 16] [--cpu 0] [--quick]
        [--parts quality,sanity,throughput,windows] [--windows 256,128,96,64,32] [--embed-cache DIR]

Modes: `full` = the model folder without its cascade (every prompt through the encoder), `cascade` =
the same folder with cascade.json and the cuts given (what `gateway serve` does with a policy whose
bands cut there); `--baseline DIR` adds another model folder without cascade (e.g. the previous head).

1. Quality, on the held-out rows of models/difficulty/labels/rubric.jsonl (never trained on): ROC AUC
   for hard (level >= 4), APGR (binary and graded, as bench/routing_quality.py), the large-tier share
   and PGR at each cut, the band agreement with the full model, and the share of prompts (and of their
   tokens) that needed the encoder.
2. The sanity pairs (tests/data/difficulty_pairs.jsonl) ordered with the cascade on.
3. Cold throughput in process: this process pinned to one CPU (`--cpu`, sched_setaffinity; ONNX Runtime
   one intra-op thread), `DifficultyClassifier.score` on ShareGPT first-turn prompts that are not in the
   labeled set, each prompt new to every classifier (cold: no cache helps). Closed loop at
   `--concurrency` (the micro-batcher as in the gateway), modes interleaved in rounds, each round on a
   new slice of prompts that every mode scores. Reports classifications/s, CPU ms per classification
   (this process's CPU time, all threads), and the encoder share. Then p50/p99 of one classification
   at concurrency 1.
4. `windows` (only when named in --parts: it embeds every labeled row once per window, minutes): the
   encoder's token window (head + tail) against quality. For each window, the head is fitted as
   `gateway train --target hard --hard-at 0.75` fits it (L2 on the validation folds of train; mean
   validation AUC over fold seeds 0, 1, 2), then the held-out AUC, the sanity pairs, the share of
   held-out prompts below each cut, and the mean number of tokens the encoder reads (its cost is about
   proportional).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.bench.report import ROOT, command_line, cpu_model, load_line, md_table
from gateway.bench.routing import apgr, pgr_at, pgr_curve
from gateway.bench.workload import sharegpt_prompts
from gateway.classifier.difficulty import DifficultyClassifier, file_sha256, load_classifier
from gateway.classifier.embedding_cache import cache_key
from gateway.classifier.encoder import DIFFICULTY, EncoderSession, default_model_path
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.embedding import EmbeddingFile
from gateway.training.quality import auc
from gateway.training.train import features, fit, fit_target, load_labeled

LABELS = ROOT / "models" / "difficulty" / "labels" / "rubric.jsonl"
PAIRS = ROOT / "tests" / "data" / "difficulty_pairs.jsonl"
HARD_LEVEL = 4
F64 = npt.NDArray[np.float64]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def open_mode(model: Path, cascade: bool, cuts: Sequence[float]) -> DifficultyClassifier:
    clf = load_classifier(model, cascade=cascade, cuts=cuts if cascade else None, threads=1)
    if cascade and clf.cascade is None:
        raise SystemExit(f"{model} has no cascade.json: train it with `gateway train` (cascade on by default)")
    return clf


async def score_all(clf: DifficultyClassifier, prompts: Sequence[str], concurrency: int = 16) -> F64:
    out = np.zeros(len(prompts))
    todo = iter(range(len(prompts)))

    async def worker() -> None:
        for i in todo:
            out[i] = await clf.score(prompts[i])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


def band_of(scores: F64, cuts: Sequence[float]) -> npt.NDArray[np.int64]:
    return np.searchsorted(np.asarray(sorted(cuts)), scores, side="right")


@dataclass
class Mode:
    name: str
    model: Path
    cascade: bool
    clf: DifficultyClassifier | None = None
    rounds: list[dict[str, float]] = field(default_factory=list)


def quality(modes: list[Mode], cuts: Sequence[float]) -> str:
    rows = [r for r in read_jsonl(LABELS) if r.get("split") == "heldout"]
    prompts = [str(r["prompt"]) for r in rows]
    level = np.array([int(r["level"]) for r in rows])
    ones = np.ones(len(rows))
    weak = {"binary": (level < HARD_LEVEL) * 1.0, "graded": 1 - (level - 1) / 4}
    tokens = {}
    scores: dict[str, F64] = {}
    encoder_share: dict[str, tuple[float, float]] = {}
    for mode in modes:
        clf = open_mode(mode.model, mode.cascade, cuts)
        assert clf.tokenizer is not None
        ids = np.array([len(clf.tokenizer.ids(p)) for p in prompts])
        tokens[mode.name] = ids
        before = clf.full
        scores[mode.name] = asyncio.run(score_all(clf, prompts))
        took_encoder = clf.full - before
        # which prompts took the encoder: those not decided; recomputed per prompt for the token share
        undecided = np.array([_undecided(clf, p) for p in prompts]) if mode.cascade else np.ones(len(prompts), bool)
        assert int(undecided.sum()) == took_encoder, (int(undecided.sum()), took_encoder)
        encoder_share[mode.name] = (took_encoder / len(prompts), float(ids[undecided].sum() / ids.sum()))
        clf.close()
    reference = next(m.name for m in modes if not m.cascade and m.model == modes[-1].model)
    table = []
    for mode in modes:
        s = scores[mode.name]
        cells = [mode.name, f"{auc(s, level >= HARD_LEVEL):.4f}"]
        cells += [f"{apgr(*pgr_curve(s, weak[k], ones)):.4f}" for k in ("binary", "graded")]
        for cut in cuts:
            share, pgr = pgr_at(s, weak["binary"], ones, cut)
            cells.append(f"{share:.1%} / {pgr:.3f}")
        agree = band_of(s, cuts) == band_of(scores[reference], cuts)
        cells.append(f"{agree.mean():.2%} ({int((~agree).sum())})")
        share, token_share = encoder_share[mode.name]
        cells.append(f"{share:.1%} / {token_share:.1%}")
        table.append(cells)
    header = ["model", "AUC (level ≥ 4)", "APGR binary", "APGR graded",
              *[f"share ≥ {c:g} / its PGR (binary)" for c in cuts],
              f"bands = `{reference}` (differing prompts)", "encoder ran: prompts / tokens"]
    n_hard = int((level >= HARD_LEVEL).sum())
    return (f"Held-out rows of models/difficulty/labels/rubric.jsonl: {len(rows)} prompts ({n_hard} hard); "
            f"cuts {', '.join(f'{c:g}' for c in cuts)}.\n\n" + md_table(header, table))


def _undecided(clf: DifficultyClassifier, prompt: str) -> bool:
    """Whether the cascade leaves this prompt to the encoder (its decision, recomputed without caches)."""
    assert clf.cascade is not None and clf.tokenizer is not None
    ids = clf.tokenizer.ids(prompt)
    return clf.cascade.decide(ids, len(prompt)) is None


def sanity(model: Path, cuts: Sequence[float]) -> str:
    pairs = read_jsonl(PAIRS)
    inverted = np.array([bool(p["inverted"]) for p in pairs])
    lines = []
    for cascade in (False, True):
        clf = open_mode(model, cascade, cuts)
        easy = asyncio.run(score_all(clf, [str(p["easy"]) for p in pairs]))
        hard = asyncio.run(score_all(clf, [str(p["hard"]) for p in pairs]))
        right = hard > easy
        lines.append(f"{'cascade' if cascade else 'full'}: {right.mean():.1%} of {len(pairs)} pairs ordered, "
                     f"{right[inverted].mean():.1%} of the {int(inverted.sum())} length-inverted ones"
                     + (f" (encoder ran for {clf.full} of {2 * len(pairs)} prompts)" if cascade else ""))
        clf.close()
    return "Sanity pairs (tests/data/difficulty_pairs.jsonl): " + "; ".join(lines) + "."


def fresh_prompts(count: int) -> list[str]:
    """Distinct ShareGPT first-turn prompts (<= 8000 characters) that are not in the labeled set."""
    labeled = {cache_key(str(r["prompt"])) for r in read_jsonl(LABELS)}
    out = [p for p in sharegpt_prompts(count + len(labeled), distinct=True) if cache_key(p) not in labeled]
    if len(out) < count:
        raise SystemExit(f"only {len(out)} unlabeled ShareGPT prompts available, asked for {count}")
    return out[:count]


async def timed(clf: DifficultyClassifier, prompts: Sequence[str], concurrency: int) -> dict[str, float]:
    before_full = clf.full
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await score_all(clf, prompts, concurrency)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"n": len(prompts), "wall_s": wall, "cpu_s": cpu, "encoder": clf.full - before_full}


async def latency(clf: DifficultyClassifier, prompts: Sequence[str]) -> tuple[float, float]:
    times = []
    for p in prompts:
        t0 = time.perf_counter()
        await clf.score(p)
        times.append(time.perf_counter() - t0)
    return float(np.percentile(times, 50) * 1e3), float(np.percentile(times, 99) * 1e3)


def throughput(modes: list[Mode], cuts: Sequence[float], args: argparse.Namespace) -> str:
    per_round, c1 = args.prompts, args.c1_prompts
    prompts = fresh_prompts(per_round * args.rounds + c1 + 32)
    warm_up, c1_prompts, rest = prompts[:32], prompts[32 : 32 + c1], prompts[32 + c1 :]
    for mode in modes:
        mode.clf = open_mode(mode.model, mode.cascade, cuts)
        asyncio.run(score_all(mode.clf, warm_up, args.concurrency))  # sessions warm; these prompts are not reused
    for r in range(args.rounds):
        chunk = rest[r * per_round : (r + 1) * per_round]
        order = modes if r % 2 == 0 else modes[::-1]
        for mode in order:
            assert mode.clf is not None
            mode.rounds.append(asyncio.run(timed(mode.clf, chunk, args.concurrency)))
    table = []
    base = None
    for mode in modes:
        assert mode.clf is not None
        n = sum(x["n"] for x in mode.rounds)
        wall, cpu, enc = (sum(x[k] for x in mode.rounds) for k in ("wall_s", "cpu_s", "encoder"))
        rps = n / wall
        base = base or rps
        p50, p99 = asyncio.run(latency(mode.clf, c1_prompts))
        table.append([mode.name, n, f"{rps:.1f}", f"{rps / base:.2f}x", f"{cpu / n * 1e3:.2f}", f"{1e3 / (cpu / n * 1e3):.0f}",
                      f"{enc / n:.1%}", ", ".join(f"{x['n'] / x['wall_s']:.0f}" for x in mode.rounds),
                      f"{p50:.2f} / {p99:.2f}"])
        mode.clf.close()
    header = ["model", "classifications", "per s (one core)", "vs first", "CPU ms each", "per CPU-second",
              "encoder ran", "per s by round", "c=1 p50 / p99 ms"]
    return (f"Cold classifications on one core (CPU {args.cpu}, pinned; ONNX Runtime 1 thread), concurrency "
            f"{args.concurrency}, {args.rounds} interleaved rounds of {per_round} new ShareGPT prompts (not in the "
            f"labeled set) per mode; c=1 latency on {c1} more. {load_line()}.\n\n" + md_table(header, table))


def windows(args: argparse.Namespace, cuts: Sequence[float]) -> str:
    rows, _ = load_labeled(LABELS)
    prompts = [r.prompt for r in rows]
    y = np.array([r.label for r in rows])
    tr = np.array([r.split == "train" for r in rows])
    keys = [r.key for r in rows if r.split == "train"]
    hard = y[~tr] >= 0.75
    pairs = read_jsonl(PAIRS)
    inverted = np.array([bool(p["inverted"]) for p in pairs])
    path = default_model_path("int8", DIFFICULTY)
    sha = file_sha256(path)
    table = []
    for window in (int(w) for w in args.windows.split(",")):
        encoder = EncoderSession(path, threads=1, tokenizer=PromptTokenizer(window))
        x = features(EmbeddingFile(args.embed_cache, sha, window).embed(encoder, prompts, f"int8, {window} tokens"), prompts)
        val, heads = [], []
        for seed in (0, 1, 2):
            opts = argparse.Namespace(val_folds=5, seed=seed, l2=None, standardize="all", epochs=100,
                                      calibration="platt", hard_at=0.75, target="hard")
            fitted = fit(x[tr], fit_target(y[tr], opts), keys, opts)
            val.append(float(next(t["val_auc"] for t in fitted.search if t["l2"] == fitted.l2) or 0.0))
            heads.append(fitted.head)
        head = heads[0]  # seed 0: what `gateway train` ships
        held = head.predict(x[~tr])
        sides = [head.predict(features(encoder.embed([str(p[k]) for p in pairs]), [str(p[k]) for p in pairs]))
                 for k in ("easy", "hard")]
        right = sides[1] > sides[0]
        tokens = np.mean([len(encoder.tokenizer.ids(p)) for p in prompts])
        table.append([window, f"{np.mean(val):.4f}", f"{auc(held, hard):.4f}", f"{right.mean():.1%} / {right[inverted].mean():.1%}",
                      " / ".join(f"{(held < c).mean():.1%}" for c in cuts), f"{tokens:.1f}"])
    header = ["window (tokens)", "validation AUC (3 fold seeds)", "held-out AUC", "sanity pairs / length-inverted",
              "held-out below " + " / ".join(f"{c:g}" for c in cuts), "mean tokens encoded"]
    return (f"Encoder token window ([CLS] + first and last (window - 2) / 2 tokens + [SEP]) against quality; "
            f"{int(tr.sum())} train, {int((~tr).sum())} held-out rows.\n\n" + md_table(header, table))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "difficulty", help="model folder with cascade.json")
    p.add_argument("--baseline", type=Path, default=None, help="another model folder, measured without cascade")
    p.add_argument("--cuts", default="0.043221,0.1617", help="band cuts (default: those of policies/example.yaml)")
    p.add_argument("--prompts", type=int, default=300, help="prompts per round and mode")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--c1-prompts", type=int, default=100, help="prompts for the concurrency-1 latency")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cpu", type=int, default=0, help="the CPU this process is pinned to")
    p.add_argument("--quick", action="store_true", help="100 prompts x 2 rounds, 40 for latency")
    p.add_argument("--parts", default="quality,sanity,throughput", help="of quality,sanity,throughput,windows")
    p.add_argument("--windows", default="256,128,96,64,32", help="token windows for the windows part")
    p.add_argument("--embed-cache", type=Path, default=None, help="folder caching embeddings (windows part)")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.rounds, args.c1_prompts = 100, 2, 40
    cuts = [float(c) for c in args.cuts.split(",") if c.strip()]
    os.sched_setaffinity(0, {args.cpu})
    modes = ([Mode("baseline (full)", args.baseline, False)] if args.baseline else []) + [
        Mode("full", args.model, False), Mode("cascade", args.model, True)]
    parts = set(args.parts.split(","))
    print(f"`{command_line()}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_model()}; "
          f"model {args.model}" + (f", baseline {args.baseline}" if args.baseline else "") + "\n", flush=True)
    if "windows" in parts:
        print(windows(args, cuts) + "\n", flush=True)
    if "quality" in parts:
        print(quality(modes, cuts) + "\n", flush=True)
    if "sanity" in parts:
        print(sanity(args.model, cuts) + "\n", flush=True)
    if "throughput" in parts:
        print(throughput(modes, cuts, args) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
