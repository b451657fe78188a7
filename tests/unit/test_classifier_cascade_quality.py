"""With the cascade on (at the cuts of policies/example.yaml), the shipped model still orders the hand-written
sanity pairs (tests/data/difficulty_pairs.jsonl) as tests/unit/test_difficulty_sanity.py requires of the full model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.difficulty import load_classifier

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [json.loads(line) for line in (ROOT / "tests" / "data" / "difficulty_pairs.jsonl").read_text("utf-8").split("\n")
         if line.strip()]
CUTS = (0.043221, 0.1617)
REQUIRED = 0.90


@pytest.fixture(scope="module")
def scored() -> tuple[np.ndarray, np.ndarray, int]:
    clf = load_classifier(ROOT / "models" / "difficulty", providers=["CPUExecutionProvider"], cuts=CUTS)
    assert clf.cascade is not None

    async def run() -> tuple[np.ndarray, np.ndarray]:
        easy = [await clf.score(p["easy"]) for p in PAIRS]
        hard = [await clf.score(p["hard"]) for p in PAIRS]
        return np.array(easy), np.array(hard)

    easy, hard = asyncio.run(run())
    clf.close()
    return easy, hard, clf.cheap


def test_the_cascade_orders_the_sanity_pairs(scored: tuple[np.ndarray, np.ndarray, int]) -> None:
    easy, hard, cheap = scored
    right = hard > easy
    wrong = [(PAIRS[i]["easy"][:60], PAIRS[i]["hard"][:60]) for i in np.flatnonzero(~right)]
    assert right.mean() >= REQUIRED, f"ordered {right.mean():.1%} of {len(PAIRS)} pairs; wrong: {wrong}"
    assert cheap > 0  # the cheap path did decide some of them


def test_the_cascade_orders_the_length_inverted_pairs(scored: tuple[np.ndarray, np.ndarray, int]) -> None:
    easy, hard, _ = scored
    inverted = np.array([p["inverted"] for p in PAIRS])
    assert (hard > easy)[inverted].mean() >= REQUIRED - 0.05
