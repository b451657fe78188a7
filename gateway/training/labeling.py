r"""Difficulty labels for the classifier head: the small tier's surprise at a reference answer.

The label source: mean per-token negative log-likelihood (nats) of ShareGPT's reference answer given
the prompt, under Gemma 3 270M Q4_K_M (the small local tier) via llama.cpp, prefill only
(gateway.training.nll). This module samples the prompts, writes rows as they are scored
(resumable), and `finalize` turns NLLs into rank-percentile labels in [0, 1] and a deterministic 80/20 split.
See models/difficulty/labels/README.md for the procedure, commands and measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from gateway.training.language import guess_language
from gateway.training.nll import ANSWER_CAP, PROMPT_CAP, Example, NllScorer
from gateway.training.sharegpt import first_exchanges

HELDOUT_PERCENT = 20
Row = dict[str, Any]


def rank_labels(values: Sequence[float]) -> list[float]:
    """Rank percentile in [0, 1]: (average rank - 1) / (n - 1); ties share a label; n == 1 -> 0.5."""
    n = len(values)
    if n == 1:
        return [0.5]
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 / (n - 1)
        i = j + 1
    return ranks


def split_of(conv_id: str) -> str:
    """"heldout" for ~20% of conversations by a hash of the id without its `_N` part suffix, else "train".

    ShareGPT V3 cuts long conversations into parts `X_0`, `X_1`, ...; hashing the stem keeps every
    part of one conversation on the same side.
    """
    stem = conv_id.rsplit("_", 1)[0] if "_" in conv_id else conv_id
    bucket = int.from_bytes(hashlib.sha256(stem.encode()).digest()[:8], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def sample(seed: int, limit: int, data: Path | None = None) -> list[tuple[str, str, str]]:
    """`limit` first exchanges: seeded shuffle of all complete ones, first of each distinct prompt."""
    pool = list(first_exchanges(data))
    random.Random(seed).shuffle(pool)
    seen: set[str] = set()
    picked: list[tuple[str, str, str]] = []
    for item in pool:
        key = " ".join(item[1].split()).lower()
        if key not in seen:
            seen.add(key)
            picked.append(item)
            if len(picked) == limit:
                break
    return picked


def read_rows(path: Path) -> list[Row]:
    """The JSONL rows of `path` (none if missing); a torn last line is ignored, any other bad line raises.

    Lines end at "\n" only: prompts hold U+2028 and friends, which `str.splitlines` would split on.
    """
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows: list[Row] = []
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n < len(lines):  # complete lines (ended by "\n") must parse
                raise ValueError(f"{path}:{n}: not a JSON row: {exc}") from None
    return rows


@contextlib.contextmanager
def _locked_append(path: Path) -> Iterator[TextIO]:
    """`path` open for appending under an exclusive lock (one writer at a time), torn last line cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another labeling run holds {path}") from None
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):  # a run killed mid-write
            os.truncate(path, data.rfind(b"\n") + 1)
        yield f


class Scorer(Protocol):
    """What labeling needs from a model: build an example, score it (NllScorer; fakes in tests)."""

    def example(self, prompt: str, answer: str, prompt_cap: int, answer_cap: int) -> Example: ...

    def nll(self, ex: Example) -> float: ...


def label_rows(
    scorer: Scorer,
    items: Iterable[tuple[str, str, str]],
    prompt_cap: int = PROMPT_CAP,
    answer_cap: int = ANSWER_CAP,
) -> Iterator[Row]:
    """One unlabeled row (no `label` / `split` yet) per (id, prompt, answer)."""
    for conv_id, prompt, answer in items:
        ex = scorer.example(prompt, answer, prompt_cap, answer_cap)
        start = time.perf_counter()
        nll = scorer.nll(ex)
        yield {
            "id": conv_id,
            "prompt": prompt,
            "prompt_tokens": ex.prompt_tokens,
            "answer_tokens": len(ex.tokens) - ex.answer_start,
            "answer_tokens_full": ex.answer_tokens_full,
            "nll": round(nll, 6),
            "language": guess_language(prompt),
            "seconds": round(time.perf_counter() - start, 4),
        }


def label_into(
    out: Path,
    items: Sequence[tuple[str, str, str]],
    scorer: Scorer,
    prompt_cap: int = PROMPT_CAP,
    answer_cap: int = ANSWER_CAP,
) -> int:
    """Append a row per item whose id `out` lacks, flushing each (progress on stderr); rows written."""
    with _locked_append(out) as f:
        done = {str(r["id"]) for r in read_rows(out)}
        todo = [item for item in items if item[0] not in done]
        print(f"{len(done)} done, {len(todo)} to label", file=sys.stderr)
        start, k = time.perf_counter(), 0
        for k, row in enumerate(label_rows(scorer, todo, prompt_cap, answer_cap), 1):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            rate = (time.perf_counter() - start) / k
            eta = rate * (len(todo) - k) / 60
            line = f"[{len(done) + k}/{len(done) + len(todo)}] {rate:.2f} s/example, ETA {eta:.1f} min"
            print(line, file=sys.stderr, flush=True)
    return k


def run(args: argparse.Namespace) -> int:
    """Label `--limit` sampled conversations into `--out`; a started file needs `--resume`."""
    if read_rows(args.out) and not args.resume:
        print(f"{args.out} already has rows: pass --resume to continue it", file=sys.stderr)
        return 2
    items = sample(args.seed, args.limit, args.data)
    from gateway.local.models import Q4, resolve

    scorer = NllScorer(args.model or resolve(Q4), n_threads=args.threads)
    try:
        label_into(args.out, items, scorer, args.prompt_cap, args.answer_cap)
    finally:
        scorer.close()
    return 0


def finalize(path: Path) -> dict[str, Any]:
    """Add `label` (NLL rank percentile over all rows) and `split` to every row, rewrite atomically."""
    with _locked_append(path):
        rows = _first_per_id(read_rows(path))
        if not rows:
            raise ValueError(f"{path} has no rows to finalize")
        _finalize_rows(rows, path)
    return stats(rows)


def _first_per_id(rows: Sequence[Row]) -> list[Row]:
    """Rows with a new id only (two runs on one file may have scored an id twice)."""
    seen: set[str] = set()
    kept: list[Row] = []
    for row in rows:
        if str(row["id"]) not in seen:
            seen.add(str(row["id"]))
            kept.append(row)
    if len(kept) < len(rows):
        print(f"dropped {len(rows) - len(kept)} rows with a repeated id", file=sys.stderr)
    return kept


def _finalize_rows(rows: list[Row], path: Path) -> None:
    """Set `label` and `split` on `rows`, then replace `path` with them (write + rename)."""
    for row, label in zip(rows, rank_labels([float(r["nll"]) for r in rows])):
        row["label"] = round(label, 6)
        row["split"] = split_of(str(row["id"]))
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Rank correlation; None when a side is constant."""
    rx, ry = np.array(rank_labels(x)), np.array(rank_labels(y))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return round(float(np.corrcoef(rx, ry)[0, 1]), 3)


def stats(rows: Sequence[Row]) -> dict[str, Any]:
    """Counts, NLL percentiles, per-language means, length correlations and cost of finalized rows."""
    nll = np.array([r["nll"] for r in rows], dtype=np.float64)
    secs = np.array([r.get("seconds", 0.0) for r in rows], dtype=np.float64)
    langs: dict[str, list[Row]] = {}
    for r in rows:
        langs.setdefault(str(r["language"]), []).append(r)
    pct = (1, 5, 10, 25, 50, 75, 90, 95, 99)
    return {
        "rows": len(rows),
        "splits": {s: sum(r["split"] == s for r in rows) for s in ("train", "heldout")},
        "hard_share": {
            s: round(float(np.mean([r["label"] >= 0.5 for r in rows if r["split"] == s] or [0.0])), 3)
            for s in ("train", "heldout")
        },
        "nll_percentiles": {f"p{p}": round(float(v), 3) for p, v in zip(pct, np.percentile(nll, pct))},
        "nll_mean": round(float(nll.mean()), 3),
        "languages": {
            lang: {
                "n": len(rs),
                "mean_nll": round(float(np.mean([r["nll"] for r in rs])), 3),
                "mean_label": round(float(np.mean([r["label"] for r in rs])), 3),
            }
            for lang, rs in sorted(langs.items(), key=lambda kv: -len(kv[1]))
        },
        "spearman_label_vs": {
            key: _spearman([float(r["label"]) for r in rows], [float(r[key]) for r in rows])
            for key in ("prompt_tokens", "answer_tokens", "answer_tokens_full")
        },
        "seconds_per_example": {
            "mean": round(float(secs.mean()), 3),
            "p50": round(float(np.median(secs)), 3),
        },
        "cpu_seconds_total": round(float(secs.sum()), 1),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway.training.labeling", description="Label prompt difficulty.")
    p.add_argument("--out", type=Path, required=True, help="JSONL file of labeled rows")
    p.add_argument("--limit", type=int, default=3000, help="conversations to sample and label")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle that samples conversations")
    p.add_argument("--resume", action="store_true", help="continue a run: skip ids already in --out")
    p.add_argument("--finalize", action="store_true", help="only add rank labels + splits, print stats")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    p.add_argument("--prompt-cap", type=int, default=PROMPT_CAP, help="prompt tokens kept (head + tail)")
    p.add_argument("--answer-cap", type=int, default=ANSWER_CAP, help="answer tokens scored")
    p.add_argument("--data", type=Path, default=None, help="ShareGPT JSON (default: the packaged one)")
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: gemma3-270m-q4_k_m)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: label (default) or `--finalize`."""
    args = _parser().parse_args(argv)
    if args.finalize:
        print(json.dumps(finalize(args.out), indent=2, ensure_ascii=False))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
