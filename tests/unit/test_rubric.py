"""gateway.training.rubric: levels to labels, the annotation view, merge, and agreement statistics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.training.rubric import agreement, check, level_label, merge, read_levels, view, weighted_kappa


def test_levels_map_onto_the_unit_interval_with_hard_at_three_quarters() -> None:
    assert [level_label(k) for k in (1, 2, 3, 4, 5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError):
        level_label(6)


def test_weighted_kappa_by_hand() -> None:
    assert weighted_kappa([1, 2, 3, 4, 5], [1, 2, 3, 4, 5]) == 1.0
    # two raters, two items: (1, 2) and (2, 1). Observed weighted disagreement 2 * (1/16) / 2 = 1/16;
    # marginals are 1/2 on levels 1 and 2 for both, expected disagreement 2 * (1/4)(1/16) = 1/32.
    assert weighted_kappa([1, 2], [2, 1]) == pytest.approx(1 - (1 / 16) / (1 / 32))
    assert weighted_kappa([1, 5, 1, 5], [5, 1, 5, 1]) < 0  # systematic reversal is worse than chance


def test_agreement_on_shared_ids() -> None:
    first = {"a": 1, "b": 2, "c": 4, "d": 5, "only-first": 3}
    second = {"a": 1, "b": 3, "c": 4, "d": 4, "only-second": 2}
    got = agreement(first, second)
    assert got["n"] == 4
    assert got["exact"] == 0.5 and got["within_one"] == 1.0
    assert got["hard_agreement"] == 1.0 and got["hard_share"] == [0.5, 0.5]


def test_merge_keeps_the_nll_label_as_a_second_column_and_splits_written_prompts(tmp_path: Path) -> None:
    nll = [{"id": "abc_0", "prompt": "hi", "nll": 2.5, "label": 0.9, "language": "en", "split": "train"}]
    written = [{"id": "w0001", "prompt": "Prove Fermat's little theorem.", "level": 5, "category": "short-hard"}]
    rows = merge([("abc_0", "hi"), ("new_1", "thanks")], nll, written, {"abc_0": 1, "new_1": 1})
    assert rows[0] == {"id": "abc_0", "source": "sharegpt", "prompt": "hi", "level": 1, "label": 0.0, "nll": 2.5,
                       "nll_label": 0.9, "language": "en", "split": "train"}
    assert rows[1]["nll"] is None and rows[1]["split"] in ("train", "heldout")  # beyond the NLL set
    assert rows[2]["label"] == 1.0 and rows[2]["split"] in ("train", "heldout") and rows[2]["source"] == "written"
    with pytest.raises(ValueError, match="abc_0"):
        merge([("abc_0", "hi")], nll, [], {})


def test_label_files_and_progress(tmp_path: Path) -> None:
    batch, labels = tmp_path / "batch.jsonl", tmp_path / "labels.jsonl"
    batch.write_text("".join(json.dumps({"id": i, "prompt": "p"}) + "\n" for i in ("a", "b")))
    labels.write_text('{"id": "a", "level": 2}\n{"id": "a", "level": 3}\n')
    assert read_levels([labels]) == {"a": 3}  # a later line wins
    assert check(batch, labels).startswith("labeled 1/2; missing 1")
    labels.write_text('{"id": "a", "level": 7}\n')
    with pytest.raises(ValueError, match="level"):
        read_levels([labels])


def test_the_view_keeps_head_and_tail_of_long_prompts() -> None:
    assert view("short") == "short"
    long = "H" * 1100 + "x" * 5000 + "T" * 400
    shown = view(long)
    assert shown.startswith("H" * 1100) and shown.endswith("T" * 400) and "5000 characters omitted" in shown
