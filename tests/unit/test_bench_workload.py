"""gateway.bench.workload: ShareGPT parsing into requests and conversations, synthetic requests."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.bench.workload import (
    RequestSpec,
    count_tokens,
    interleave,
    sharegpt_conversations,
    sharegpt_requests,
    synthetic_requests,
)

LONG = "one two three four five six"


def _conv(cid: str, *turns: tuple[str, str]) -> dict[str, object]:
    return {"id": cid, "conversations": [{"from": r, "value": v} for r, v in turns]}


def _write(tmp_path: Path) -> Path:
    convs = [
        _conv("a_0", ("human", "what is a cache line?"), ("gpt", LONG), ("human", "and a TLB then?"),
              ("gpt", "a translation lookaside buffer caches pages"), ("human", "thanks a lot my friend"),
              ("gpt", "you are very welcome indeed")),
        _conv("b_0", ("human", "hi"), ("gpt", LONG)),  # prompt under 4 tokens: skipped
        _conv("c_0", ("gpt", "a system greeting first"), ("human", "tell me about rust"), ("gpt", "ok")),
        _conv("d_0", ("human", "explain the borrow checker please"), ("gpt", LONG + " seven")),
    ]
    text = json.dumps(convs)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: -40])  # cut inside the last conversation, like the packaged file
    return path


def test_first_turn_requests_take_lengths_from_the_data(tmp_path: Path) -> None:
    specs = sharegpt_requests(10, seed=0, path=_write(tmp_path))
    assert sorted(s.conversation_id for s in specs) == ["a_0"]  # b: short prompt; c: short answer; d: cut off
    (spec,) = specs
    assert spec.messages == ({"role": "user", "content": "what is a cache line?"},)
    assert spec.max_tokens == 6 and spec.prompt_tokens == count_tokens("what is a cache line?") == 6
    assert spec.turn == 0


def test_conversations_carry_earlier_turns_with_reference_answers(tmp_path: Path) -> None:
    (conv,) = sharegpt_conversations(5, max_turns=3, seed=0, path=_write(tmp_path))
    assert [s.turn for s in conv] == [0, 1, 2]
    third = conv[2]
    assert [m["role"] for m in third.messages] == ["user", "assistant", "user", "assistant", "user"]
    assert third.messages[1]["content"] == LONG and third.messages[-1]["content"] == "thanks a lot my friend"
    assert third.max_tokens == count_tokens("you are very welcome indeed")
    assert third.prompt_tokens == sum(count_tokens(m["content"]) for m in third.messages)
    assert len(sharegpt_conversations(5, max_turns=2, seed=0, path=_write(tmp_path))[0]) == 2


def test_interleave_keeps_turn_order() -> None:
    def spec(cid: str, turn: int) -> RequestSpec:
        return RequestSpec(({"role": "user", "content": "x"},), 4, 4, cid, turn)

    convs = [[spec("a", 0), spec("a", 1), spec("a", 2)], [spec("b", 0)], [spec("c", 0), spec("c", 1)]]
    order = [(s.conversation_id, s.turn) for s in interleave(convs)]
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]


def test_real_sharegpt_sample_is_seeded() -> None:
    first = sharegpt_requests(20, seed=1, pool=500)
    assert len(first) == 20 and first == sharegpt_requests(20, seed=1, pool=500)
    assert first != sharegpt_requests(20, seed=2, pool=500)
    assert all(4 <= s.prompt_tokens <= 1024 and s.max_tokens >= 4 for s in first)
    assert all(s.prompt_tokens + s.max_tokens <= 2048 for s in first)


def test_synthetic_lengths_are_exact() -> None:
    specs = synthetic_requests(5, prompt_tokens=50, output_tokens=7, seed=3)
    assert len(specs) == 5 and len({s.messages[0]["content"] for s in specs}) == 5
    assert all(s.prompt_tokens == 50 and s.max_tokens == 7 for s in specs)
    assert specs == synthetic_requests(5, prompt_tokens=50, output_tokens=7, seed=3)
