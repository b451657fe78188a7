"""Issue 32, the pieces of a resumed stream: the continuation request, the splice, the emulator's continuation."""

from __future__ import annotations

import random

import orjson
import pytest

from gateway.upstream.continuation import ContinuationScanner, continuation_body, not_resumable
from gateway.emulator import PROFILES, Engine
from gateway.emulator.parse import BadRequest, parse_body
from gateway.emulator.tokens import detokenize
from gateway.sse import SseScanner

CHAT = {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 40, "stream": True}


def test_chat_continuation_puts_the_text_sent_as_the_assistant_turn_and_lowers_max_tokens() -> None:
    body = continuation_body("chat", {**CHAT, "min_tokens": 10, "max_completion_tokens": 40}, " the answer", 2, 38)
    assert body["messages"][-1] == {"role": "assistant", "content": " the answer"}
    assert body["messages"][:-1] == CHAT["messages"]
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_tokens"] == 38 and body["max_completion_tokens"] == 38 and body["min_tokens"] == 8
    assert "continue_final_message" not in CHAT  # the request's own body is left alone


def test_completion_continuation_appends_to_the_prompt() -> None:
    body = continuation_body("completions", {"model": "m", "prompt": "Once", "echo": True, "max_tokens": 9},
                             " upon", 1, 8)
    assert body["prompt"] == "Once upon" and body["max_tokens"] == 8 and "echo" not in body


def test_without_a_limit_the_continuation_sets_none() -> None:
    body = continuation_body("chat", {k: v for k, v in CHAT.items() if k != "max_tokens"}, "x", 1, None)
    assert "max_tokens" not in body and "max_completion_tokens" not in body


@pytest.mark.parametrize(("body", "why"), [
    ({**CHAT, "n": 2}, "n > 1"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}, None),
    (CHAT, None),
])
def test_what_is_never_resumed(body: dict, why: str | None) -> None:
    got = not_resumable("chat", body)
    assert (got is None) if why is None else (got is not None and why in got)


def _events(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


def test_the_splice_keeps_the_first_parts_id_drops_the_role_chunk_and_sums_usage() -> None:
    first = SseScanner("chat", forward_usage=True, collect_text=True)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a"}
    first.feed(_events({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                       {**head, "choices": [{"index": 0, "delta": {"content": " one"}}]},
                       {**head, "choices": [{"index": 0, "delta": {"content": " two"}}]}))
    spliced = ContinuationScanner(first, (0, 2))
    other = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 9, "model": "b"}
    out = spliced.feed(_events(
        {**other, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**other, "choices": [{"index": 0, "delta": {"content": " three"}, "finish_reason": "stop"}]},
        {**other, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}}))
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert len(events) == 2  # the role chunk is gone
    assert all(e["id"] == "chatcmpl-1" and e["created"] == 1 and e["model"] == "a" for e in events)
    assert events[0]["choices"][0]["delta"] == {"content": " three"}
    # the first part read the prompt (10) and wrote 2; this one read 10 + 2 and wrote 1: the client's usage
    # describes its request, the prompt once (the log line prices both parts' prompts: gateway.upstream.resume)
    assert events[1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    tally = spliced.tally
    assert tally.content_chunks == 3 and "".join(tally.text or ()) == " one two three"
    assert tally.finish_reason == "stop" and tally.head["id"] == "chatcmpl-1"
    assert spliced.ending().endswith(b"data: [DONE]\n\n") and b"chatcmpl-1" in spliced.ending("stop")


def _chat(messages: list[dict], max_tokens: int | None, **extra: object) -> bytes:
    body: dict = {"model": "m", "messages": messages, **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return orjson.dumps(body)


def _answer(engine: Engine, raw: bytes) -> tuple[list[int], str]:
    req = parse_body(raw, "chat")
    seq = engine.create(req.prompt, req.prompt_hash, req.max_tokens, ignore_eos=req.ignore_eos, request_seed=req.seed,
                        prefill=req.prefill, base_tokens=req.base_tokens)
    return seq.output_ids, seq.finish_reason


@pytest.mark.parametrize("max_tokens", [None, 60])
def test_the_emulator_continues_its_own_answer_token_for_token(max_tokens: int | None) -> None:
    """Greedy: the answer cut at any k and continued from its text is the uninterrupted answer; the finish
    reason is the same (max_tokens lowered by k, as the gateway sends it)."""
    engine, rng = Engine(PROFILES["instant"], seed=5), random.Random(3)
    for trial in range(40):
        messages = [{"role": "user", "content": f"question {trial} about {rng.random()}"}]
        whole, reason = _answer(engine, _chat(messages, max_tokens))
        assert len(whole) >= 2
        k = rng.randrange(1, len(whole))
        rest, rest_reason = _answer(engine, _chat(
            [*messages, {"role": "assistant", "content": detokenize(whole[:k])}],
            None if max_tokens is None else max_tokens - k, continue_final_message=True, add_generation_prompt=False))
        assert whole[:k] + rest == whole and rest_reason == reason


def test_the_emulator_continues_a_text_it_did_not_write_with_its_own_draw() -> None:
    engine = Engine(PROFILES["instant"], seed=5)
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Not from the vocabulary!"}]
    rest, _ = _answer(engine, _chat(messages, 20, continue_final_message=True, add_generation_prompt=False))
    again, _ = _answer(engine, _chat(messages, 20, continue_final_message=True, add_generation_prompt=False))
    assert rest == again and 1 <= len(rest) <= 20


@pytest.mark.parametrize(("extra", "messages", "param"), [
    ({"continue_final_message": True}, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
     "add_generation_prompt"),
    ({"continue_final_message": True, "add_generation_prompt": False}, [{"role": "user", "content": "q"}], "messages"),
])
def test_the_emulator_refuses_a_continuation_vllm_would_refuse(extra: dict, messages: list, param: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_body(_chat(messages, 5, **extra), "chat")
    assert err.value.param == param


def test_a_chat_continued_on_completions_sends_the_rendered_prompt_and_its_text() -> None:
    """llama.cpp's llama-server with a built-in template: the chat as its template renders it, plus the text sent."""
    body = continuation_body("chat", {**CHAT, "tools": [], "temperature": 0, "max_completion_tokens": 40},
                             " The answer", 2, 38, template="<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n")
    assert body["prompt"] == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n The answer"
    assert "messages" not in body and "tools" not in body and "continue_final_message" not in body
    assert body["max_tokens"] == 38 and "max_completion_tokens" not in body and body["temperature"] == 0


def test_a_chat_continued_on_completions_keeps_its_response_format() -> None:
    """What the client asked of the answer's shape goes with it to /completions (issue 38: it was dropped)."""
    shape = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    body = continuation_body("chat", {**CHAT, "response_format": shape}, ' {"a":', 3, 10, template="<model>\n")
    assert body["response_format"] == shape and body["prompt"] == '<model>\n {"a":'


def test_completion_chunks_of_a_continued_chat_become_chat_chunks() -> None:
    first = SseScanner("chat", forward_usage=True, collect_text=True)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a"}
    first.feed(_events({**head, "choices": [{"index": 0, "delta": {"content": " one"}}]}))
    spliced = ContinuationScanner(first, (0, 1), completions=True)
    other = {"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b"}
    out = spliced.feed(_events({**other, "choices": [{"index": 0, "text": " two", "finish_reason": None}]},
                               {**other, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
    events = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]
    assert [e["object"] for e in events] == ["chat.completion.chunk"] * 2 and events[0]["id"] == "chatcmpl-1"
    assert events[0]["choices"][0]["delta"] == {"content": " two"} and events[1]["choices"][0]["finish_reason"] == "stop"
    assert "".join(spliced.tally.text or ()) == " one two" and spliced.tally.finish_reason == "stop"
