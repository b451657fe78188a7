"""Labeling logic without the model: capping, log-softmax, languages, rank labels, splits, resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gateway.training.labeling import finalize, label_into, rank_labels, read_rows, sample, split_of
from gateway.training.language import guess_language
from gateway.training.nll import Example, cap_head_tail, mean_nll


def test_cap_head_tail_keeps_head_and_tail() -> None:
    toks = list(range(10))
    assert cap_head_tail(toks, 10) == toks
    assert cap_head_tail(toks, 20) == toks
    assert cap_head_tail(toks, 4) == [0, 1, 8, 9]
    assert cap_head_tail(toks, 5) == [0, 1, 2, 8, 9]
    assert cap_head_tail(toks, 1) == [0]
    assert len(cap_head_tail(list(range(2000)), 512)) == 512


def test_mean_nll_matches_a_plain_python_log_softmax() -> None:
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((9, 50)) * 8 + 30).astype(np.float32)
    targets = [int(t) for t in rng.integers(0, 50, 9)]
    expected = 0.0
    for row, t in zip(logits.tolist(), targets):
        expected += math.log(math.fsum(math.exp(x) for x in row)) - row[t]
    for rows in (1, 4, 32):
        assert mean_nll(logits, targets, rows=rows) == pytest.approx(expected / 9, abs=1e-9)


def test_mean_nll_is_stable_for_huge_logits() -> None:
    logits = np.array([[1e4, 1e4 - math.log(3)]], dtype=np.float32)
    assert mean_nll(logits, [1]) == pytest.approx(math.log(4 / 1), abs=1e-3)


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("Write a Python function that returns the sum of a list.", "en"),
        ("def f(x):\n    return x + 1", "en"),
        ("请帮我写一篇关于人工智能的文章", "zh"),
        ("인공지능에 대한 글을 써 주세요", "ko"),
        ("人工知能についての記事を書いてください", "ja"),
        ("Напиши статью об искусственном интеллекте", "ru"),
        ("¿Qué es la inteligencia artificial y para qué sirve?", "es"),
        ("Peux-tu écrire un article sur les réseaux de neurones pour moi", "fr"),
        ("12345 !!!", "other"),
    ],
)
def test_guess_language(text: str, lang: str) -> None:
    assert guess_language(text) == lang


def test_rank_labels_are_uniform_tie_aware_and_outlier_proof() -> None:
    assert rank_labels([3.0, 1.0, 2.0]) == [1.0, 0.0, 0.5]
    assert rank_labels([1.0, 1.0, 5.0, 0.0]) == pytest.approx([0.5, 0.5, 1.0, 0.0])
    assert rank_labels([7.0]) == [0.5]
    assert rank_labels([1.0, 2.0, 1e9]) == rank_labels([1.0, 2.0, 3.0])
    labels = rank_labels([float(x) for x in np.random.default_rng(0).lognormal(size=1001)])
    assert sorted(labels) == pytest.approx([i / 1000 for i in range(1001)])


def test_split_is_deterministic_per_conversation_and_about_20_percent() -> None:
    assert split_of("QWJhYvA_0") == split_of("QWJhYvA_0") == split_of("QWJhYvA_7")
    splits = [split_of(f"conv{i}_0") for i in range(5000)]
    assert set(splits) == {"train", "heldout"}
    assert 0.17 < splits.count("heldout") / 5000 < 0.23


class FakeScorer:
    """Counts calls; NLL = prompt length, so results are predictable."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def example(self, prompt: str, answer: str, prompt_cap: int, answer_cap: int) -> Example:
        self.calls.append(prompt)
        return Example([2, 1, 1, 3], 2, len(prompt), len(answer))

    def nll(self, ex: Example) -> float:
        return float(ex.prompt_tokens)


def test_resume_skips_done_ids_and_cuts_a_torn_line(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = [(f"id{i}_0", "p" * (i + 1), "answer") for i in range(5)]
    assert label_into(out, items[:2], FakeScorer()) == 2
    with out.open("a") as f:
        f.write('{"id": "id2_0", "nll": 1')  # a run killed mid-write
    scorer = FakeScorer()
    assert label_into(out, items, scorer) == 3
    assert scorer.calls == ["ppp", "pppp", "ppppp"]
    rows = read_rows(out)
    assert [r["id"] for r in rows] == [i[0] for i in items]
    assert all(json.loads(line) for line in out.read_text().splitlines())
    assert label_into(out, items, FakeScorer()) == 0


def test_finalize_adds_rank_labels_and_splits(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = [(f"id{i}_0", "p" * (i + 1), "answer") for i in range(5)]
    label_into(out, list(reversed(items)), FakeScorer())
    summary = finalize(out)
    rows = read_rows(out)
    assert [r["label"] for r in rows] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert [r["split"] for r in rows] == [split_of(r["id"]) for r in rows]
    assert summary["rows"] == 5 and sum(summary["splits"].values()) == 5
    assert summary["nll_percentiles"]["p50"] == 3.0


def test_sample_is_seeded_prefix_consistent_and_dedups_prompts(tmp_path: Path) -> None:
    convs = [
        {"id": f"c{i}_0", "conversations": [{"from": "human", "value": f"q{i % 7}"}, {"from": "gpt", "value": "a"}]}
        for i in range(30)
    ]
    data = tmp_path / "data.json"
    data.write_text(json.dumps(convs))
    seven = sample(1, 100, data)
    assert len(seven) == 7 and len({p for _, p, _ in seven}) == 7
    assert sample(1, 3, data) == seven[:3]
    assert sample(1, 7, data) == seven
    assert sample(2, 7, data) != seven


def test_one_writer_at_a_time(tmp_path: Path) -> None:
    import fcntl

    out = tmp_path / "labels.jsonl"
    with out.open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="another labeling run"):
            label_into(out, [("a_0", "p", "a")], FakeScorer())
        with pytest.raises(RuntimeError, match="another labeling run"):
            finalize(out)
    assert label_into(out, [("a_0", "p", "a")], FakeScorer()) == 1


def test_finalize_keeps_the_first_row_of_a_repeated_id(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    lengths = {"prompt_tokens": 1, "answer_tokens": 1, "answer_tokens_full": 1}
    rows = [{"id": "a_0", "nll": 1.0, "language": "en", **lengths}, {"id": "b_0", "nll": 2.0, "language": "en", **lengths}]
    out.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {**rows[0], "nll": 9.0}]))
    assert finalize(out)["rows"] == 2
    assert [(r["id"], r["nll"], r["label"]) for r in read_rows(out)] == [("a_0", 1.0, 0.0), ("b_0", 2.0, 1.0)]


def test_rows_survive_unicode_line_separators(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    items = [("a_0", "line one\u2028line two\u2029\x85\x1c end", "answer"), ("b_0", "plain", "answer")]
    assert label_into(out, items, FakeScorer()) == 2
    assert [r["prompt"] for r in read_rows(out)] == [items[0][1], "plain"]
    assert finalize(out)["rows"] == 2


def test_a_bad_complete_line_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    out.write_text('{"id": "a_0"}\nnot json\n{"id": "b_0"}\n{"id": "c_')
    with pytest.raises(ValueError, match=":2: not a JSON row"):
        read_rows(out)
    out.write_text('{"id": "a_0"}\n{"id": "c_')
    assert read_rows(out) == [{"id": "a_0"}]
