"""The shipped difficulty model orders hand-written (easy, hard) prompt pairs as a person would.

tests/data/difficulty_pairs.jsonl: pairs written by hand, blind to the model, never trained on
(models/difficulty/MODEL_CARD.md, "Sanity suite"); at least a third are length-inverted (the easy
prompt is the longer one), so a length detector cannot pass.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from gateway.training.calibrate import score_prompts

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [json.loads(line) for line in (ROOT / "tests" / "data" / "difficulty_pairs.jsonl").read_text("utf-8").split("\n")
         if line.strip()]
REQUIRED = 0.90


@pytest.fixture(scope="module")
def scores() -> tuple[np.ndarray, np.ndarray]:
    easy, _ = score_prompts(ROOT / "models" / "difficulty", [p["easy"] for p in PAIRS], None)
    hard, _ = score_prompts(ROOT / "models" / "difficulty", [p["hard"] for p in PAIRS], None)
    return easy, hard


def test_the_suite_is_large_and_a_third_length_inverted() -> None:
    inverted = [p for p in PAIRS if len(p["easy"]) > len(p["hard"])]
    assert len(PAIRS) >= 100
    assert len(inverted) * 3 >= len(PAIRS)
    assert all(p["inverted"] == (len(p["easy"]) > len(p["hard"])) for p in PAIRS)


def test_the_shipped_model_orders_the_pairs(scores: tuple[np.ndarray, np.ndarray]) -> None:
    easy, hard = scores
    right = hard > easy
    wrong = [(PAIRS[i]["easy"][:60], PAIRS[i]["hard"][:60]) for i in np.flatnonzero(~right)]
    assert right.mean() >= REQUIRED, f"ordered {right.mean():.1%} of {len(PAIRS)} pairs; wrong: {wrong}"


def test_the_model_also_orders_the_length_inverted_pairs(scores: tuple[np.ndarray, np.ndarray]) -> None:
    easy, hard = scores
    inverted = np.array([p["inverted"] for p in PAIRS])
    assert (hard > easy)[inverted].mean() >= REQUIRED - 0.05
