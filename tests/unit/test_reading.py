"""The request's reading (gateway.reading): every input counted and keyed, outputs counted, as a property.

Each test pins one promise of issue 37: two requests whose readings differ never share an exact-cache key or a
semantic namespace; the prompt caps see every input (token ids, tools, tool-call arguments, media); the rate
limit charges every output at its ceiling; the semantic cache only reads plain user text."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from gateway.cache.keys import cacheable, response_key, semantic_namespace, uncached_reasons
from gateway.config.policies import CacheRule
from gateway.reading import CHARS_PER_TOKEN, MEDIA_TOKENS, Reading, read
from gateway.types import Endpoint

RULE = CacheRule(enabled=True, mode="always")
IMAGE_A = "data:image/png;base64," + "A" * 4000
IMAGE_B = "data:image/png;base64," + "A" * 3999 + "B"


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": list(messages), **fields}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def limited(endpoint: Endpoint, body: dict[str, Any], ceiling: int = 32) -> Reading:
    reading = read(endpoint, body)
    reading.limit(ceiling, reading.stop)
    return reading


def key(endpoint: Endpoint, body: dict[str, Any], ceiling: int = 32) -> str:
    return response_key("alice", "small", limited(endpoint, body, ceiling))


PAIRS_THAT_DIFFER: list[tuple[str, Endpoint, dict[str, Any], dict[str, Any]]] = [
    ("token-id prompts", "completions", {"prompt": [101, 2023, 2003]}, {"prompt": [7, 7, 7, 42]}),
    ("token ids vs text", "completions", {"prompt": [7]}, {"prompt": "7"}),
    ("the image's bytes", "chat", chat(user([{"type": "text", "text": "what is it?"}, image(IMAGE_A)])),
     chat(user([{"type": "text", "text": "what is it?"}, image(IMAGE_B)]))),
    ("the image's detail", "chat", chat(user([image(IMAGE_A)])),
     chat(user([{"type": "image_url", "image_url": {"url": IMAGE_A, "detail": "low"}}]))),
    ("an audio part", "chat", chat(user([{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])),
     chat(user([{"type": "input_audio", "input_audio": {"data": "AAAB", "format": "wav"}}]))),
    ("the role", "chat", chat(user("2+2?")), chat({"role": "assistant", "content": "2+2?"})),
    ("the system prompt", "chat", chat({"role": "system", "content": "be terse"}, user("hi")),
     chat({"role": "system", "content": "be verbose"}, user("hi"))),
    ("a tool", "chat", chat(user("weather?"), tools=[{"type": "function", "function": {"name": "a"}}]),
     chat(user("weather?"), tools=[{"type": "function", "function": {"name": "b"}}])),
    ("tool-call arguments", "chat",
     chat({"role": "assistant", "content": None, "tool_calls": [
         {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}, user("and?")),
     chat({"role": "assistant", "content": None, "tool_calls": [
         {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 2}"}}]}, user("and?"))),
    ("the tool call's id", "chat", chat({"role": "tool", "tool_call_id": "a", "content": "42"}),
     chat({"role": "tool", "tool_call_id": "b", "content": "42"})),
    ("response_format", "chat", chat(user("hi"), response_format={"type": "json_object"}), chat(user("hi"))),
    ("n", "chat", chat(user("hi"), n=2), chat(user("hi"))),
    ("a prompt list's order", "completions", {"prompt": ["a", "b"]}, {"prompt": ["b", "a"]}),
    ("one prompt or two", "completions", {"prompt": ["ab"]}, {"prompt": ["a", "b"]}),
    ("two turns or one turn of two parts", "chat", chat(user("a"), user("a")),
     chat(user([{"type": "text", "text": "a"}, {"type": "text", "text": "a"}]))),
    ("text split across parts", "chat", chat(user([{"type": "text", "text": "ab"}])),
     chat(user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]))),
    ("temperature", "chat", chat(user("hi"), temperature=0), chat(user("hi"), temperature=0.5)),
    ("seed", "chat", chat(user("hi"), seed=1), chat(user("hi"), seed=2)),
    ("stop", "chat", chat(user("hi"), stop=["x"]), chat(user("hi"))),
    ("logit_bias", "chat", chat(user("hi"), logit_bias={"5": 10}), chat(user("hi"))),
    ("suffix", "completions", {"prompt": "def f(", "suffix": ")"}, {"prompt": "def f("}),
]


@pytest.mark.parametrize(("what", "endpoint", "a", "b"), PAIRS_THAT_DIFFER, ids=[p[0] for p in PAIRS_THAT_DIFFER])
def test_requests_that_differ_in_any_input_or_parameter_never_share_a_key(
        what: str, endpoint: Endpoint, a: dict[str, Any], b: dict[str, Any]) -> None:
    assert key(endpoint, a) != key(endpoint, b), what


def test_the_ceiling_and_the_scope_and_the_tier_are_in_the_key() -> None:
    body = chat(user("hi"))
    assert key("chat", body, 16) != key("chat", body, 17)
    reading = limited("chat", body)
    assert response_key("alice", "small", reading) != response_key("bob", "small", reading)
    assert response_key("alice", "small", reading) != response_key("alice", "large", reading)


def test_fields_that_do_not_change_the_answer_share_a_key() -> None:
    body = chat(user("hi"), temperature=0)
    same = {**body, "model": "small", "stream": True, "stream_options": {"include_usage": True}, "user": "u1"}
    assert key("chat", body) == key("chat", same)
    # max_tokens and max_completion_tokens are one ceiling, whichever field asked it
    assert key("chat", {**body, "max_tokens": 9}) == key("chat", {**body, "max_completion_tokens": 9})


def test_token_id_prompts_image_only_and_assistant_only_requests_have_no_semantic_text() -> None:
    assert read("completions", {"prompt": [101, 2023, 2003]}).semantic_text is None
    assert read("completions", {"prompt": ["a", "b"]}).semantic_text is None
    assert read("chat", chat(user([{"type": "text", "text": "what is it?"}, image(IMAGE_A)]))).semantic_text is None
    assert read("chat", chat({"role": "assistant", "content": "What is 2+2?"})).semantic_text is None
    assert read("chat", chat(user("hi"), {"role": "assistant", "content": "hello"})).semantic_text is None
    assert read("chat", chat({"role": "system", "content": "s"}, user("What is 2+2?"))).semantic_text == "What is 2+2?"
    assert read("completions", {"prompt": "Once upon"}).semantic_text == "Once upon"


def test_the_semantic_namespace_holds_everything_but_the_last_user_text() -> None:
    def namespace(body: dict[str, Any]) -> str:
        return semantic_namespace("alice", "small", limited("chat", body))

    base = namespace(chat({"role": "system", "content": "terse"}, user("What is 2+2?")))
    assert base == namespace(chat({"role": "system", "content": "terse"}, user("what's two plus two")))
    assert base != namespace(chat({"role": "system", "content": "verbose"}, user("What is 2+2?")))
    assert base != namespace(chat(user([image(IMAGE_A)]), {"role": "assistant", "content": "a cat"},
                                  {"role": "system", "content": "terse"}, user("What is 2+2?")))
    assert base != namespace(chat({"role": "system", "content": "terse"}, user("What is 2+2?"), temperature=1))


def test_input_size_counts_every_input() -> None:
    ids = read("completions", {"prompt": list(range(50_000))})
    assert ids.input_chars == 50_000 * CHARS_PER_TOKEN and ids.input_tokens == 50_000
    tools = read("chat", chat(user("hi"), tools=[{"type": "function", "function": {"name": "f",
                                                                                     "description": "x" * 100_000}}]))
    assert tools.input_chars > 100_000 and tools.input_tokens > 100_000 // CHARS_PER_TOKEN
    media = read("chat", chat(user([image("data:image/png;base64," + "A" * 100_000)])))
    assert media.input_chars > 100_000 and media.input_tokens >= MEDIA_TOKENS
    args = read("chat", chat({"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "y" * 100_000}}]}, user("ok")))
    assert args.input_chars > 100_000
    lists = read("completions", {"prompt": [[1, 2, 3], [4, 5]]})
    assert lists.input_tokens == 5 and lists.prompts == 2


def test_outputs_and_the_charge_count_every_prompt_and_choice() -> None:
    reading = limited("completions", {"prompt": ["a"] * 8, "n": 16}, ceiling=32)
    assert reading.outputs == 128 and reading.output_tokens_max() == 128 * 32
    assert reading.charge() == reading.input_tokens + 128 * 32
    best = limited("completions", {"prompt": "a", "n": 2, "best_of": 5}, ceiling=10)
    assert best.outputs == 2 and best.generated == 5 and best.output_tokens_max() == 50
    embeddings = limited("embeddings", {"input": ["a", "b"]}, ceiling=256)
    assert embeddings.output_tokens_max() == 0 and embeddings.prompts == 2


def test_only_single_replayable_answers_are_cacheable() -> None:
    assert cacheable(limited("chat", chat(user("hi"))), RULE)
    assert not cacheable(limited("completions", {"prompt": ["a", "b"]}), RULE)
    assert not cacheable(limited("chat", chat(user("hi"), n=2)), RULE)
    assert not cacheable(limited("completions", {"prompt": "a", "best_of": 2}), RULE)
    assert not cacheable(limited("chat", chat(user("hi"), tools=[{"type": "function"}])), RULE)
    assert not cacheable(limited("chat", chat(user("hi"), logprobs=True)), RULE)
    assert not cacheable(limited("embeddings", {"input": "a"}), RULE)
    deterministic = CacheRule(enabled=True, mode="deterministic")
    assert not cacheable(limited("chat", chat(user("hi"))), deterministic)
    assert cacheable(limited("chat", chat(user("hi"), seed=3)), deterministic)
    assert not cacheable(limited("chat", chat(user("hi"), seed=True)), deterministic)
    reasons = uncached_reasons(limited("chat", chat(user("hi"), n=2, temperature=0.7, logprobs=True)), deterministic)
    assert len(reasons) == 3 and "'logprobs'" in reasons[0] and "2 answers" in reasons[1] and "0.7" in reasons[2]


# ---- the same promises, as properties over generated requests ------------------------------------------------

TEXT = st.text(min_size=0, max_size=12)
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT),
    st.builds(lambda u: image("data:image/png;base64," + u), st.text("AB", min_size=1, max_size=8)),
    st.builds(lambda d: {"type": "input_audio", "input_audio": {"data": d, "format": "wav"}},
              st.text("AB", min_size=1, max_size=8)))
CONTENT = st.one_of(TEXT, st.lists(PART, min_size=1, max_size=3))
MESSAGE = st.builds(lambda role, content: {"role": role, "content": content},
                    st.sampled_from(["system", "user", "assistant", "tool"]), CONTENT)
PARAMS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0, 0.5, 1]), "seed": st.integers(0, 3), "n": st.integers(1, 3),
    "stop": st.lists(st.sampled_from(["a", "b"]), max_size=2), "top_p": st.sampled_from([0.5, 1]),
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
        {"name": st.sampled_from(["f", "g"])})}), min_size=1, max_size=2)})
PROMPT = st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3), st.lists(st.integers(0, 9), min_size=1, max_size=4),
                   st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=3))


@st.composite
def bodies(draw: st.DrawFn) -> tuple[Endpoint, dict[str, Any]]:
    if draw(st.booleans()):
        return "chat", {"messages": draw(st.lists(MESSAGE, min_size=1, max_size=4)), **draw(PARAMS)}
    params = {k: v for k, v in draw(PARAMS).items() if k != "tools"}
    return "completions", {"prompt": draw(PROMPT), **params}


def meaning(endpoint: Endpoint, body: dict[str, Any]) -> bytes:
    """What the backend reads, written independently of gateway.reading: the body less the fields that change
    nothing, with the spellings a backend reads alike made one: n 1 and none, no stop and an empty list, a
    one-element prompt list and its element, one text part and its text."""
    fields = {k: v for k, v in body.items() if k not in ("model", "stream", "user")}
    fields.setdefault("n", 1)
    if not fields.get("stop"):
        fields.pop("stop", None)
    prompt = fields.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        fields["prompt"] = prompt[0]
    if "messages" in fields:
        fields["messages"] = [{**m, "content": _one_text(m["content"])} for m in fields["messages"]]
    return orjson.dumps([endpoint, fields], option=orjson.OPT_SORT_KEYS)


def _one_text(content: Any) -> Any:
    if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        return content[0]["text"]
    return content


@settings(max_examples=400, deadline=None)
@given(bodies(), bodies())
def test_two_generated_requests_share_a_key_only_when_they_mean_the_same(
        a: tuple[Endpoint, dict[str, Any]], b: tuple[Endpoint, dict[str, Any]]) -> None:
    same_key = key(*a) == key(*b)
    assert same_key == (meaning(*a) == meaning(*b)), (a, b)


@settings(max_examples=400, deadline=None)
@given(bodies(), st.integers(1, 64))
def test_generated_requests_are_charged_every_output_and_every_input(
        request: tuple[Endpoint, dict[str, Any]], ceiling: int) -> None:
    endpoint, body = request
    reading = limited(endpoint, copy.deepcopy(body), ceiling)
    prompts = body.get("prompt")
    count = len(prompts) if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int) else 1
    assert reading.output_tokens_max() >= count * body.get("n", 1) * ceiling
    strings = [s for s in _strings(body.get("messages", body.get("prompt"))) if s]
    assert reading.input_chars >= sum(len(s) for s in strings)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):  # the text a backend reads, not the names of roles and part types
        return [s for k, v in value.items() if k not in ("role", "type", "format") for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []
