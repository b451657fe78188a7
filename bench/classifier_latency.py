"""Prompt-encoder latency: p50/p99 of EncoderSession.embed (tokenize + ONNX) per variant.

    .venv/bin/python bench/classifier_latency.py [--graphs difficulty,sentence] [--variants int8,fp16]
        [--threads 1] [--quick]

Graphs: `difficulty` (the classifier's 4-layer encoder: what a request waits for) and `sentence`
(the 6-layer sentence embedding the semantic cache uses). Grid per graph and variant: batch 1, 8, 32, 64 x prompts of exactly 32, 128 and 256 tokens ([CLS] and [SEP] included),
on `--threads` intra-op threads (default 1), providers as the gateway picks them (CUDA then CPU)
unless --cpu. Each cell: 2 warm-up calls, then timed calls: at least --min-runs, then until --seconds or --max-runs.
Prints a markdown table, the command, the provider actually used and the machine's load;
writes JSON + markdown under bench/results/. Target: CPU p99 <= 10 ms for 1 x 128 tokens, 1 thread.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass

from gateway.bench.report import command_line, cpu_model, stamp, write_results
from gateway.bench.summary import percentile
from gateway.classifier.encoder import GRAPHS, VARIANTS, EncoderSession, default_model_path, file_name, models_dir
from gateway.classifier.tokenize import PromptTokenizer


@dataclass(frozen=True, slots=True)
class Cell:
    graph: str
    variant: str
    provider: str
    batch: int
    tokens: int
    runs: int
    p50_ms: float
    p99_ms: float
    per_prompt_p50_ms: float


def prompts_of(tok: PromptTokenizer, tokens: int, count: int, rng: random.Random) -> list[str]:
    """`count` texts of exactly `tokens` tokens each (whole-word vocabulary entries, one token per word)."""
    words = [w for w in tok.backend.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2]
    words = [w for w in words if tok.backend.encode(w, add_special_tokens=False).ids == [tok.backend.token_to_id(w)]]
    texts = [" ".join(rng.choice(words) for _ in range(tokens - 2)) for _ in range(count)]
    assert all(len(tok.ids(t)) == tokens for t in texts), "prompt length is off"
    return texts


def measure(session: EncoderSession, texts: list[str], seconds: float, min_runs: int, max_runs: int) -> list[float]:
    for _ in range(2):
        session.embed(texts)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < deadline):
        start = time.perf_counter()
        session.embed(texts)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def run(args: argparse.Namespace) -> list[Cell]:
    rng = random.Random(0)
    tok = PromptTokenizer()
    pool = {n: prompts_of(tok, n, max(args.batches), rng) for n in args.tokens}
    providers = ["CPUExecutionProvider"] if args.cpu else None
    cells = []
    for graph, variant in args.files:
        path = default_model_path(variant, GRAPHS[graph])
        session = EncoderSession(path, providers=providers, threads=args.threads, tokenizer=tok)
        for batch in args.batches:
            for n in args.tokens:
                times = measure(session, pool[n][:batch], args.seconds, args.min_runs, args.max_runs)
                p50, p99 = percentile(times, 50), percentile(times, 99)
                cell = Cell(graph, variant, session.provider, batch, n, len(times), p50, p99, p50 / batch)
                print(f"  {graph}.{variant} b={batch} n={n}: p50 {p50:.2f} ms p99 {p99:.2f} ms ({len(times)} runs)", file=sys.stderr)
                cells.append(cell)
    return cells


def table(cells: list[Cell]) -> str:
    lines = [
        "| graph | variant | provider | batch | tokens | p50 (ms) | p99 (ms) | p50 per prompt (ms) | runs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in cells:
        provider = c.provider.removesuffix("ExecutionProvider")
        lines.append(
            f"| {c.graph} | {c.variant} | {provider} | {c.batch} | {c.tokens} | {c.p50_ms:.2f} | {c.p99_ms:.2f} "
            f"| {c.per_prompt_p50_ms:.2f} | {c.runs} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, object]:
    cpu = cpu_model()
    versions = {p: importlib.metadata.version(p) for p in ("onnxruntime-gpu", "numpy", "tokenizers")}
    return {"cpu": cpu, "cores": os.cpu_count(), "loadavg": os.getloadavg(), "python": platform.python_version(), **versions}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="difficulty,sentence", help=f"comma list of {sorted(GRAPHS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma list (default: the files present)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--tokens", default="32,128,256")
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per cell (after --min-runs)")
    parser.add_argument("--min-runs", type=int, default=10)
    parser.add_argument("--max-runs", type=int, default=300)
    parser.add_argument("--cpu", action="store_true", help="CPU provider only")
    parser.add_argument("--quick", action="store_true", help="batch 1 and 8 only, 1 s per cell")
    args = parser.parse_args()
    wanted = [(g, v) for g in args.graphs.split(",") if g for v in args.variants.split(",") if v]
    args.files = [(g, v) for g, v in wanted if (models_dir() / file_name(v, GRAPHS[g])).is_file()]
    args.batches = [int(b) for b in ("1,8" if args.quick else args.batches).split(",")]
    args.tokens = [int(n) for n in args.tokens.split(",")]
    args.seconds = 1.0 if args.quick else args.seconds
    before = machine()
    cells = run(args)
    after = os.getloadavg()
    command = command_line()
    report = "\n".join([
        f"Command: `{command}`",
        f"Machine: {before['cpu']}, {before['cores']} cores; load average before {before['loadavg']}, after {after}",
        f"Threads: {args.threads} intra-op; onnxruntime-gpu {before['onnxruntime-gpu']}",
        "",
        table(cells),
    ])
    print(report)
    payload = {"command": command, "machine": before, "loadavg_after": after, "cells": [asdict(c) for c in cells]}
    write_results("classifier_latency", stamp(), payload, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
