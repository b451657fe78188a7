"""Rubric labels (models/difficulty/labels/RUBRIC.md): annotation view, merge and agreement.

    python -m gateway.training.rubric show BATCH.jsonl START COUNT       # prompts to read
    python -m gateway.training.rubric check BATCH.jsonl LABELS.jsonl     # progress of a pass
    python -m gateway.training.rubric merge --sample 7000 --nll sharegpt-nll.jsonl --written written.jsonl \
        --passes rubric/pass1_*.jsonl --out rubric.jsonl                 # the training file
    python -m gateway.training.rubric agree --labels rubric.jsonl --second rubric/pass2.jsonl

A level (1-5) is a reader's judgement of a prompt against the rubric; this module never makes
one. `merge` joins the passes to the prompts: the first `--sample` prompts of the seeded ShareGPT
sample that `labeling` draws (seed 0; its first 3,500 are the NLL set, whose rows keep `nll` and
their NLL label as `nll_label`), then the written prompts,
and sets `label = (level - 1) / 4`, so `gateway train` reads it like any [0, 1] label and
`hard = level >= 4` is `label >= 0.75`. `agree` compares two independent passes on the same ids.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.training.labeling import sample, split_of
from gateway.training.language import guess_language
from gateway.training.quality import spearman

LEVELS = (1, 2, 3, 4, 5)
HARD_LEVEL = 4
HARD_LABEL = (HARD_LEVEL - 1) / 4  # 0.75: `gateway train --hard-at` for rubric labels
VIEW_HEAD, VIEW_TAIL = 1100, 400  # characters an annotator sees of a very long prompt
Row = dict[str, Any]


def level_label(level: int) -> float:
    """The [0, 1] training label of a rubric level: 1 -> 0.0, 3 -> 0.5, 5 -> 1.0."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return (level - 1) / 4


def read_rows(path: Path) -> list[Row]:
    """JSON objects of a JSONL file (split on newlines only: prompts hold U+2028)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def read_levels(paths: Iterable[Path]) -> dict[str, int]:
    """id -> level over the label files of a pass; a later line for the same id wins."""
    levels: dict[str, int] = {}
    for path in paths:
        for n, row in enumerate(read_rows(path), 1):
            level = row.get("level")
            if level not in LEVELS or not isinstance(row.get("id"), str):
                raise ValueError(f"{path}:{n}: need a string id and a level in 1..5, got {row}")
            levels[row["id"]] = int(level)
    return levels


def view(prompt: str) -> str:
    """What the annotator reads: the prompt, or its head and tail when it is very long."""
    if len(prompt) <= VIEW_HEAD + VIEW_TAIL:
        return prompt
    omitted = len(prompt) - VIEW_HEAD - VIEW_TAIL
    return f"{prompt[:VIEW_HEAD]}\n[... {omitted} characters omitted ...]\n{prompt[-VIEW_TAIL:]}"


def show(batch: Path, start: int, count: int) -> str:
    rows = read_rows(batch)
    parts = [f"=== #{i} id={r['id']} chars={len(r['prompt'])}\n{view(r['prompt'])}"
             for i, r in enumerate(rows[start:start + count], start)]
    return "\n".join(parts + [f"--- shown {start}..{min(start + count, len(rows)) - 1} of {len(rows)}"])


def check(batch: Path, labels: Path) -> str:
    ids = [r["id"] for r in read_rows(batch)]
    levels = read_levels([labels])
    missing = [i for i in ids if i not in levels]
    unknown = set(levels) - set(ids)
    counts = sorted(Counter(levels[i] for i in ids if i in levels).items())
    return (f"labeled {len(ids) - len(missing)}/{len(ids)}; missing {len(missing)} (first: {missing[:3]}); "
            f"unknown ids {len(unknown)}\nlevels: {counts}")


def merge(sampled: Sequence[tuple[str, str]], nll_rows: Sequence[Row], written: Sequence[Row],
          levels: dict[str, int]) -> list[Row]:
    """The rubric training set: every sampled ShareGPT prompt (id, prompt) and written prompt with its pass-1 level."""
    nll = {row["id"]: row for row in nll_rows}
    out: list[Row] = []
    for key, prompt in sampled:
        if key not in levels:
            raise ValueError(f"ShareGPT row {key} has no level")
        scored = nll.get(key, {})
        out.append({"id": key, "source": "sharegpt", "prompt": prompt, "level": levels[key],
                    "label": level_label(levels[key]), "nll": scored.get("nll"), "nll_label": scored.get("label"),
                    "language": guess_language(prompt), "split": split_of(key)})
    for row in written:
        level = int(row["level"])
        out.append({"id": row["id"], "source": "written", "prompt": row["prompt"], "level": level,
                    "label": level_label(level), "category": row.get("category"),
                    "language": row.get("language") or guess_language(row["prompt"]), "split": split_of(row["id"])})
    return out


def weighted_kappa(a: Sequence[int], b: Sequence[int]) -> float:
    """Cohen's kappa with quadratic weights on the 1-5 scale (1 = perfect, 0 = chance)."""
    k = len(LEVELS)
    observed = np.zeros((k, k))
    for x, y in zip(a, b, strict=True):
        observed[x - 1, y - 1] += 1
    observed /= observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    grid = np.arange(k)
    weights = (grid[:, None] - grid[None, :]) ** 2 / (k - 1) ** 2
    return round(float(1 - (weights * observed).sum() / (weights * expected).sum()), 4)


def agreement(first: dict[str, int], second: dict[str, int]) -> dict[str, Any]:
    """Agreement of two passes on the ids they share."""
    ids = sorted(set(first) & set(second))
    a, b = [first[i] for i in ids], [second[i] for i in ids]
    diff = np.abs(np.array(a) - np.array(b))
    hard_a, hard_b = np.array(a) >= HARD_LEVEL, np.array(b) >= HARD_LEVEL
    return {"n": len(ids), "exact": round(float((diff == 0).mean()), 4), "within_one": round(float((diff <= 1).mean()), 4),
            "spearman": spearman(a, b), "weighted_kappa": weighted_kappa(a, b),
            "hard_agreement": round(float((hard_a == hard_b).mean()), 4),
            "hard_share": [round(float(hard_a.mean()), 4), round(float(hard_b.mean()), 4)]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway.training.rubric", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="print prompts of a batch for annotation")
    s.add_argument("batch", type=Path)
    s.add_argument("start", type=int)
    s.add_argument("count", type=int)
    c = sub.add_parser("check", help="progress of a label file against its batch")
    c.add_argument("batch", type=Path)
    c.add_argument("labels", type=Path)
    m = sub.add_parser("merge", help="join the passes into the training file")
    m.add_argument("--sample", type=int, required=True, help="ShareGPT prompts of labeling's seed-0 sample")
    m.add_argument("--nll", type=Path, required=True, help="the NLL-labeled ShareGPT rows")
    m.add_argument("--written", type=Path, required=True, help="written prompts with their level")
    m.add_argument("--passes", type=Path, nargs="+", required=True, help="pass-1 label files")
    m.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("agree", help="agreement of a second pass with the first")
    a.add_argument("--labels", type=Path, required=True, help="the merged file (first pass)")
    a.add_argument("--second", type=Path, required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "show":
        print(show(args.batch, args.start, args.count))
    elif args.command == "check":
        print(check(args.batch, args.labels))
    elif args.command == "merge":
        sampled = [(key, prompt) for key, prompt, _ in sample(0, args.sample)]
        rows = merge(sampled, read_rows(args.nll), read_rows(args.written), read_levels(args.passes))
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(json.dumps({"rows": len(rows), "levels": sorted(Counter(r["level"] for r in rows).items())}))
    else:
        first = {r["id"]: int(r["level"]) for r in read_rows(args.labels)}
        print(json.dumps(agreement(first, read_levels([args.second])), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
