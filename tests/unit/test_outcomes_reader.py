"""Reading measured outcomes (gateway.training.outcomes): the shared/outcomes shape, errors with file:line."""

import json
from pathlib import Path

import pytest

from gateway.training.outcomes import hash_split, normalize_text, read_outcomes


def write(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "o.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


GOOD = {"id": "a/1", "source": "src", "split": "train", "task": "gsm8k", "prompt": "What is 2 + 2?",
        "scores": {"small": 0.0, "large": 1.0}, "scale": "exact match"}


def test_reads_the_shared_shape(tmp_path: Path) -> None:
    cost = dict(GOOD, id="a/2", prompt="Name a prime.\u2028Only one.", cost_usd={"small": 0.001, "large": 0.01})
    rows = read_outcomes([write(tmp_path, GOOD, "", cost)])
    assert [r.id for r in rows] == ["a/1", "a/2"]
    assert rows[0].scores == {"small": 0.0, "large": 1.0} and rows[0].cost_usd is None
    assert rows[0].task == "gsm8k" and rows[0].source_split == "train" and rows[0].split in ("train", "heldout")
    assert rows[1].cost_usd == {"small": 0.001, "large": 0.01}
    assert rows[1].prompt.endswith("Only one.")  # U+2028 inside a prompt is not a line break


def test_optional_fields_get_defaults(tmp_path: Path) -> None:
    (row,) = read_outcomes([write(tmp_path, {"prompt": "hi", "scores": {"m": 1}})])
    assert row.source == "unknown" and row.task == "unknown" and len(row.id) == 16


@pytest.mark.parametrize(("row", "message"), [
    ("{not json", "o.jsonl:2: not JSON"),
    ({"scores": {"m": 1}}, "o.jsonl:2: `prompt` must be a non-empty string"),
    ({"prompt": "x", "scores": {}}, "o.jsonl:2: `scores` must be a non-empty object"),
    ({"prompt": "x", "scores": {"m": 1.5}}, "o.jsonl:2: `scores.m` = 1.5 is outside [0, 1]"),
    ({"prompt": "x", "scores": {"m": "1"}}, "o.jsonl:2: `scores.m` must be a finite number"),
    ({"prompt": "x", "scores": {"m": True}}, "o.jsonl:2: `scores.m` must be a finite number"),
    ({"prompt": "x", "scores": {"m": 1}, "cost_usd": {"m": -1}}, "o.jsonl:2: `cost_usd.m` = -1 is negative"),
    ({"prompt": "x", "scores": {"m": 1}, "task": 3}, "o.jsonl:2: `task` must be a string"),
    ([1, 2], "o.jsonl:2: a row must be a JSON object"),
])
def test_a_bad_row_names_file_line_and_field(tmp_path: Path, row: object, message: str) -> None:
    with pytest.raises(ValueError, match="^.*" + message.replace("[", r"\[").replace("]", r"\]").replace("+", r"\+")):
        read_outcomes([write(tmp_path, GOOD, row)])


def test_a_score_a_hair_outside_the_unit_interval_is_clipped(tmp_path: Path) -> None:
    (row,) = read_outcomes([write(tmp_path, {"prompt": "x", "scores": {"m": -0.033, "n": 1.01}})])
    assert row.scores == {"m": 0.0, "n": 1.0}


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no outcome rows"):
        read_outcomes([write(tmp_path, "")])


def test_the_split_follows_the_normalized_text() -> None:
    assert normalize_text("  What IS\n 2+2? ") == "what is 2+2?"
    assert hash_split("What is 2+2?") == hash_split("what  is 2+2?\n")
    texts = [f"question number {i}" for i in range(2000)]
    share = sum(hash_split(t) == "heldout" for t in texts) / len(texts)
    assert 0.17 < share < 0.23
