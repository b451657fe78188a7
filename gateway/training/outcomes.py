"""Measured outcomes: per prompt, how well each of several real models answered it (shared/outcomes shape).

    rows = read_outcomes([Path("../shared/outcomes/llmrouter_dcrouter.jsonl"), ...])

One JSON object a line: `prompt` (string), `scores` ({model: score in [0, 1]}, at least one), optional `id`,
`source`, `task`, `split` (the source's own split, kept as `source_split`) and `cost_usd` ({model: dollars}).
A score within SCORE_SLACK of [0, 1] is clipped into it.
A bad row raises ValueError naming file:line and the field. Each row's `split` is the project's own:
"heldout" for ~20 % of prompts by a hash of the normalized text (near-duplicates of one benchmark item
appear in several public sets and tasks: they must land on the same side), else "train".
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HELDOUT_SHARE = 0.2
SCORE_SLACK = 0.05  # a metric a hair outside [0, 1] (one RouterArena row: -0.033) is clipped; beyond, an error


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """One prompt and its measured per-model scores (comparable within a source, not across sources)."""

    id: str
    source: str
    task: str
    prompt: str
    scores: dict[str, float]
    cost_usd: dict[str, float] | None
    split: str  # "train" | "heldout": by hash of the normalized prompt (hash_split)
    source_split: str = ""

    @property
    def key(self) -> str:
        """The hash of the normalized prompt: the split and the embedding cache follow it."""
        return text_key(self.prompt)


def normalize_text(text: str) -> str:
    """NFKC, lower case, whitespace runs collapsed: what near-duplicate items have in common."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def text_key(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode("utf-8", "surrogatepass")).hexdigest()


def hash_split(text: str, heldout_share: float = HELDOUT_SHARE) -> str:
    """"heldout" for ~heldout_share of normalized texts, else "train" (stable across runs and machines)."""
    bucket = int(text_key(text)[:12], 16) % 1000
    return "heldout" if bucket < round(heldout_share * 1000) else "train"


def _number_map(value: Any, where: str, field: str, unit: bool) -> dict[str, float]:
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{where}: `{field}` must be a non-empty object {{model: number}}")
    out: dict[str, float] = {}
    for model, number in value.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ValueError(f"{where}: `{field}.{model}` must be a finite number, got {number!r}")
        if unit and not -SCORE_SLACK <= number <= 1.0 + SCORE_SLACK:
            raise ValueError(f"{where}: `{field}.{model}` = {number} is outside [0, 1]")
        if not unit and number < 0:
            raise ValueError(f"{where}: `{field}.{model}` = {number} is negative")
        out[str(model)] = min(max(float(number), 0.0), 1.0) if unit else float(number)
    return out


def parse_row(row: Any, where: str, heldout_share: float = HELDOUT_SHARE) -> OutcomeRow:
    """One decoded JSON line as an OutcomeRow; ValueError naming `where` and the field otherwise."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be a JSON object")
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"{where}: `prompt` must be a non-empty string")
    scores = _number_map(row.get("scores"), where, "scores", unit=True)
    cost = row.get("cost_usd")
    for field in ("id", "source", "task", "split"):
        if row.get(field) is not None and not isinstance(row[field], str):
            raise ValueError(f"{where}: `{field}` must be a string, got {row[field]!r}")
    return OutcomeRow(
        id=str(row.get("id") or text_key(prompt)[:16]), source=str(row.get("source") or "unknown"),
        task=str(row.get("task") or "unknown"), prompt=prompt, scores=scores,
        cost_usd=None if cost is None else _number_map(cost, where, "cost_usd", unit=False),
        split=hash_split(prompt, heldout_share), source_split=str(row.get("split") or ""),
    )


def read_outcomes(paths: Iterable[Path], heldout_share: float = HELDOUT_SHARE) -> list[OutcomeRow]:
    """The rows of every file, in order; ValueError with file:line on the first bad one."""
    paths = list(paths)
    rows: list[OutcomeRow] = []
    for path in paths:
        lines = Path(path).read_text(encoding="utf-8").split("\n")  # not splitlines(): prompts hold U+2028
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                decoded = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not JSON ({err.msg} at column {err.colno})") from None
            rows.append(parse_row(decoded, f"{path}:{n}", heldout_share))
    if not rows:
        raise ValueError(f"no outcome rows in {', '.join(map(str, paths))}")
    return rows
