"""The continuation of a broken stream (gateway/upstream/continuation.py), pinned exactly for the resume target's
mutants (issue 42): the continuation request body field by field, why a request is never resumed word for word,
and the splice (`ContinuationScanner`): the events' bytes, the usage the client is sent, a chat continued on
/completions. test_resume_pieces.py tells the story; these pin the values."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.sse import OutputLimit, SseScanner
from gateway.upstream.continuation import ContinuationScanner, continuation_body, not_resumable

MESSAGES = [{"role": "user", "content": "hi"}]
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a"}
OTHER = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 9, "model": "b"}


def events(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


def parsed(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]


def first_part(endpoint: str = "chat", *, forward_usage: bool = True, limit: OutputLimit | None = None) -> SseScanner:
    scanner = SseScanner(endpoint, forward_usage=forward_usage, collect_text=True, limit=limit)  # type: ignore[arg-type]
    if endpoint == "chat":
        scanner.feed(events({**HEAD, "choices": [{"index": 0, "delta": {"content": " one"}}]}))
    else:
        scanner.feed(events({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "a",
                             "choices": [{"index": 0, "text": " one"}]}))
    return scanner


# -- continuation_body ---------------------------------------------------------------------------------------------

def test_a_chat_continuation_body_exactly() -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 40, "stream": True, "temperature": 0.5}
    assert continuation_body("chat", body, " so far", 3, 37) == {
        "model": "m", "messages": [*MESSAGES, {"role": "assistant", "content": " so far"}], "stream": True,
        "temperature": 0.5, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 37}


def test_a_completions_continuation_body_exactly() -> None:
    body = {"model": "m", "prompt": "Once", "echo": False, "max_tokens": 9}
    assert continuation_body("completions", body, " upon", 1, 8) == {"model": "m", "prompt": "Once upon",
                                                                     "max_tokens": 8}


def test_a_chat_on_completions_body_exactly() -> None:
    body = {"model": "m", "messages": MESSAGES, "tools": [], "tool_choice": "none", "logprobs": True,
            "max_completion_tokens": 20, "stream": True, "response_format": {"type": "json_object"}}
    assert continuation_body("chat", body, " x", 2, 18, template="<t>") == {
        "model": "m", "stream": True, "response_format": {"type": "json_object"}, "prompt": "<t> x", "max_tokens": 18}


@pytest.mark.parametrize(("asked", "sent", "left"), [(10, 3, 7), (3, 3, 0), (2, 5, 0), (0, 0, 0)])
def test_min_tokens_drop_by_the_tokens_sent_and_never_below_zero(asked: int, sent: int, left: int) -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, "min_tokens": asked}, "x", sent, None)
    assert body["min_tokens"] == left


def test_min_tokens_that_are_no_number_are_left_alone() -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, "min_tokens": "5"}, "x", 3, None)
    assert body["min_tokens"] == "5"


@pytest.mark.parametrize(("asked", "left", "expected"), [
    ({"max_tokens": 10}, 7, {"max_tokens": 7}),
    ({"max_completion_tokens": 10}, 7, {"max_tokens": 7, "max_completion_tokens": 7}),
    ({"max_completion_tokens": None, "max_tokens": 10}, 7, {"max_tokens": 7}),
    ({"max_completion_tokens": 10, "max_tokens": 10}, None, {}),
    ({}, None, {}),
])
def test_the_limits_of_a_continuation(asked: dict, left: int | None, expected: dict) -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, **asked}, "x", 3, left)
    assert {k: v for k, v in body.items() if k in ("max_tokens", "max_completion_tokens")} == expected


# -- not_resumable ---------------------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(("endpoint", "body", "why"), [
    ("chat", {"messages": MESSAGES, "n": 2}, "n > 1"),
    ("completions", {"prompt": "p", "n": 3}, "n > 1"),
    ("chat", {"messages": MESSAGES, "n": 1}, None),
    ("chat", {"messages": MESSAGES, "n": "2"}, None),
    ("chat", {"messages": MESSAGES, "tools": TOOLS}, "the request offers tools (a tool call may be half sent)"),
    ("chat", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"},
     "the request offers tools (a tool call may be half sent)"),
    ("chat", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"}, None),
    ("chat", {"messages": MESSAGES, "tools": []}, None),
    ("chat", {"messages": MESSAGES, "functions": [{"name": "f"}]},
     "the request offers functions (a call may be half sent)"),
    ("chat", {"messages": MESSAGES, "functions": []}, None),
    ("completions", {"prompt": ["a", "b"]}, "the prompt is not a single string"),
    ("completions", {"prompt": [1, 2]}, "the prompt is not a single string"),
    ("completions", {"prompt": "p", "tools": TOOLS, "functions": [{"name": "f"}]}, None),
    ("chat", {"messages": MESSAGES, "prompt": ["a"]}, None),
])
def test_why_a_request_is_never_resumed_word_for_word(endpoint: str, body: dict, why: str | None) -> None:
    assert not_resumable(endpoint, body) == why  # type: ignore[arg-type]


# -- ContinuationScanner -----------------------------------------------------------------------------------------------

def test_the_spliced_events_bytes_exactly() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": " two"}}]}))
    assert out == b"data: " + orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": " two"}}]}) + b"\n\n"


def test_the_continuation_shares_the_answers_tally_and_forgets_the_first_parts_usage() -> None:
    first = first_part()
    first.feed(events({**HEAD, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}))
    assert first.tally.usage is not None
    spliced = ContinuationScanner(first, (0, 1))
    assert spliced.tally is first.tally and spliced.tally.usage is None
    assert spliced.endpoint == "chat" and spliced.forward_usage is True


def test_the_continuation_keeps_the_first_parts_cap() -> None:
    first = first_part(limit=OutputLimit(tokens=None, chars=6))
    spliced = ContinuationScanner(first, (0, 1))
    assert spliced.limit == first.limit
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": " two three"}}]}))
    assert parsed(out)[0]["choices"][0]["delta"]["content"] == " t"  # 4 + 2 = the 6 characters
    assert spliced.tally.capped


def test_the_continuation_drops_a_usage_chunk_the_first_part_would_not_forward() -> None:
    spliced = ContinuationScanner(first_part(forward_usage=False), (0, 1))
    assert spliced.forward_usage is False
    out = spliced.feed(events({**OTHER, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                                                "total_tokens": 11}}))
    assert out == b""
    assert spliced.tally.usage == {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}


@pytest.mark.parametrize(("delta", "extra", "kept"), [
    ({"role": "assistant", "content": ""}, {}, None),
    ({"role": "assistant"}, {}, None),
    ({"role": "assistant", "content": "hey"}, {}, {"content": "hey"}),
    ({"role": "assistant", "content": ""}, {"finish_reason": "stop"}, {"content": ""}),
    ({"role": "assistant", "tool_calls": [{"index": 0}]}, {}, {"tool_calls": [{"index": 0}]}),
])
def test_the_opening_role_chunk_of_a_continuation(delta: dict, extra: dict, kept: dict | None) -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": delta, **extra}]}))
    if kept is None:
        assert out == b""
    else:
        (event,) = parsed(out)
        assert event["choices"][0]["delta"] == kept and event["id"] == "chatcmpl-1"


def test_a_role_chunk_carrying_usage_is_kept() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                               "usage": {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}}))
    (event,) = parsed(out)
    assert event["choices"][0]["delta"] == {}
    assert event["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_only_the_first_choice_loses_its_role() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": "a"}},
                                                   {"index": 1, "delta": {"role": "assistant", "content": ""}}]}))
    (event,) = parsed(out)
    assert event["choices"][1]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(("sent", "usage", "merged"), [
    # the last part's sent count (5) comes off the prompt and onto the completion; never the second part's (2)
    ((0, 2, 5), {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
     {"prompt_tokens": 15, "completion_tokens": 9, "total_tokens": 24}),
    ((0, 7), {"prompt_tokens": 3, "completion_tokens": 1}, {"prompt_tokens": 0, "completion_tokens": 8,
                                                            "total_tokens": 8}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 11}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 10}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 10, "x": 1}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
      "prompt_tokens_details": {"cached_tokens": 10, "x": 1}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 4}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": None},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": None}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": None}, {"prompt_tokens": 12, "completion_tokens": None}),
    ((0, 2), {"prompt_tokens": "12", "completion_tokens": 1}, {"prompt_tokens": "12", "completion_tokens": 1}),
])
def test_the_usage_the_client_is_sent(sent: tuple[int, ...], usage: dict, merged: dict) -> None:
    spliced = ContinuationScanner(first_part(), sent)
    out = spliced.feed(events({**OTHER, "choices": [], "usage": usage}))
    (event,) = parsed(out)
    assert event["usage"] == merged
    assert {k: event[k] for k in HEAD} == HEAD


@pytest.mark.parametrize(("choice", "delta", "finish"), [
    ({"index": 0, "text": " two", "finish_reason": None}, {"content": " two"}, None),
    ({"text": " two"}, {"content": " two"}, None),
    ({"index": 0, "text": "", "finish_reason": "length"}, {}, "length"),
    ({"index": 0, "finish_reason": "stop"}, {}, "stop"),
])
def test_a_completion_choice_becomes_a_chat_choice_exactly(choice: dict, delta: dict, finish: str | None) -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": [choice, "not a choice"]}))
    (event,) = parsed(out)
    assert event == {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def test_a_second_choice_keeps_its_index_when_made_a_chat_choice() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": [{"index": 0, "text": "a"}, {"index": 3, "text": "b"}]}))
    (event,) = parsed(out)
    assert [c["index"] for c in event["choices"]] == [0, 3]


def test_a_completion_chunk_without_choices_keeps_none() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": None, "usage": {"prompt_tokens": 3, "completion_tokens": 1}}))
    (event,) = parsed(out)
    assert event["choices"] == [] and event["usage"]["completion_tokens"] == 2


def test_a_completions_stream_continued_on_completions_is_not_made_chat() -> None:
    spliced = ContinuationScanner(first_part("completions"), (0, 1), completions=True)
    assert spliced.endpoint == "completions"
    chunk = {"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
             "choices": [{"index": 0, "text": " two", "finish_reason": None, "delta": {"role": "assistant"}}]}
    (event,) = parsed(spliced.feed(events(chunk)))
    assert event["choices"] == chunk["choices"]  # text kept, and a completions stream has no role to drop
    assert event["id"] == "cmpl-1" and "".join(spliced.tally.text or ()) == " one two"
