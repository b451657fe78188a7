"""The reading's parts, exactly (issue 42: mutants of gateway/reading.py that the reading's tests let survive,
since those compare two readings' keys and a change made to every reading alike keeps every comparison): each
kind of input becomes the part it should, with its kind, its role, its value and its turn; counts, the semantic
text and the keys follow from them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.reading import CHARS_PER_TOKEN, MEDIA_TOKENS, Part, read


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": list(messages), **fields}


def test_text_messages_are_text_parts_by_role_and_turn() -> None:
    r = read("chat", chat({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}))
    assert r.parts == (Part("text", "system", "be brief", 0), Part("text", "user", "hi", 1))
    assert r.semantic_text == "hi"
    assert (r.prompts, r.n, r.best_of, r.input_chars, r.input_tokens) == (1, 1, 1, 10, 3)


def test_a_name_or_tool_call_id_is_its_own_text_part() -> None:
    r = read("chat", chat({"role": "user", "name": "ann", "content": "hi"},
                          {"role": "tool", "tool_call_id": "c1", "content": "42"}))
    assert r.parts == (Part("text", "user", "ann\x00", 0), Part("text", "user", "hi", 0),
                       Part("text", "tool", "\x00c1", 1), Part("text", "tool", "42", 1))
    assert r.semantic_text is None  # the last turn is no user's


def test_a_named_user_turn_has_no_semantic_text() -> None:
    assert read("chat", chat({"role": "user", "name": "ann", "content": "hi"})).semantic_text is None
    assert read("chat", chat({"role": "user", "content": "hi"})).semantic_text == "hi"


def test_content_parts_by_type() -> None:
    r = read("chat", chat({"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "a"},
        {"type": "input_text", "text": "b"},
        {"text": "c"},
        {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://img"}},
        {"type": "input_image", "image_url": "https://img2"},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_data": "ZZ"}},
        {"type": "refusal", "refusal": "no"},
        {"type": "mystery", "b": 1, "a": 2},
        {"type": "image_url", "image_url": {"detail": "low"}},
    ]}))
    assert r.parts[1:] == (  # the second message: turn 1
        Part("text", "user", "a", 1), Part("text", "user", "b", 1), Part("text", "user", "c", 1),
        Part("media", "user", "low\x00data:x", 1), Part("media", "user", "https://img", 1),
        Part("media", "user", '{"image_url":"https://img2","type":"input_image"}', 1),  # not under its type: whole
        Part("media", "user", "AAAA", 1), Part("media", "user", "ZZ", 1),
        Part("text", "user", "no", 1),
        Part("media", "user", '{"a":2,"b":1,"type":"mystery"}', 1),  # unknown: whole, keys sorted
        Part("media", "user", '{"image_url":{"detail":"low"},"type":"image_url"}', 1),  # no reference: whole
    )
    assert r.media_parts == 7
    assert r.semantic_text is None  # several parts: no plain user turn


def test_a_text_part_needs_text() -> None:
    r = read("chat", chat({"role": "user", "content": [{"type": "text", "text": 5}, {"type": "refusal"}]}))
    assert r.parts == (Part("media", "user", '{"text":5,"type":"text"}', 0),
                       Part("media", "user", '{"type":"refusal"}', 0))


@pytest.mark.parametrize(("content", "semantic"), [
    ([{"type": "text", "text": "one"}], "one"),
    ([{"type": "input_text", "text": "one"}], "one"),
    ([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}], None),
    ([{"type": "image_url", "image_url": {"url": "u"}}], None),
])
def test_the_semantic_text_is_one_plain_user_text(content: list[Any], semantic: str | None) -> None:
    assert read("chat", chat({"role": "user", "content": content})).semantic_text == semantic


def test_tool_calls_and_function_calls_are_parts_of_their_turn() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    r = read("chat", chat({"role": "user", "content": "x"},
                          {"role": "assistant", "content": None, "tool_calls": [call],
                           "function_call": {"name": "g", "arguments": "{\"a\":1}"}}))
    assert r.parts == (Part("text", "user", "x", 0),
                       Part("tool_call", "assistant", '{"function":{"arguments":"{}","name":"f"},"id":"c1",'
                                                      '"type":"function"}', 1),
                       Part("tool_call", "assistant", '{"arguments":"{\\"a\\":1}","name":"g"}', 1))


def test_tools_functions_and_the_response_format_come_first() -> None:
    r = read("chat", chat({"role": "user", "content": "x"}, tools=[{"type": "function", "b": 1, "a": 0}],
                          functions=[{"name": "f"}], response_format={"type": "json_object"}))
    assert r.parts[:3] == (Part("tool", "tools", '[{"a":0,"b":1,"type":"function"}]'),
                           Part("tool", "tools", '[{"name":"f"}]'),
                           Part("tool", "response_format", '{"type":"json_object"}'))
    assert r.cache_class == "never"


def test_completion_prompts() -> None:
    assert read("completions", {"prompt": "hi"}).parts == (Part("text", "prompt", "hi"),)
    ids = read("completions", {"prompt": [5, 6, 7]})
    assert (ids.parts, ids.prompts, ids.input_tokens, ids.input_chars) == (
        (Part("token_ids", "prompt", (5, 6, 7)),), 1, 3, 3 * CHARS_PER_TOKEN)
    several = read("completions", {"prompt": ["a", [1, 2], "b"]})
    assert several.parts == (Part("text", "prompt", "a", 0), Part("token_ids", "prompt", (1, 2), 1),
                             Part("text", "prompt", "b", 2))
    assert several.prompts == 3 and several.semantic_text is None
    assert read("completions", {"prompt": []}).prompts == 1
    assert read("completions", {"prompt": "hi", "n": 2, "best_of": 3}).generated == 3


def test_embeddings_inputs() -> None:
    r = read("embeddings", {"input": ["a", "bb"], "n": 4})
    assert r.parts == (Part("text", "prompt", "a", 0), Part("text", "prompt", "bb", 1))
    assert (r.prompts, r.n, r.best_of) == (2, 1, 1)


def test_media_counts_its_tokens() -> None:
    r = read("chat", chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "abcd"}}]}))
    assert (r.input_chars, r.input_tokens) == (4, MEDIA_TOKENS)


def test_keys_do_not_depend_on_the_order_fields_are_written_in() -> None:
    one = read("chat", chat({"role": "user", "content": "x"}, temperature=0, seed=1,
                            tools=[{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}}]))
    two = read("chat", {"seed": 1, "temperature": 0, "model": "auto", "messages": [{"content": "x", "role": "user"}],
                        "tools": [{"function": {"parameters": {"a": 2, "b": 1}, "name": "f"}, "type": "function"}]})
    for r in (one, two):
        r.limit(32, r.stop)
    assert one.key() == two.key() and one.context_key() == two.context_key()


def test_a_part_is_text_by_its_type_not_by_a_stray_text_field() -> None:
    r = read("chat", chat({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "u"}, "text": "caption"},
        {"type": ["odd"], "text": 1},  # a type that is no string: the part, whole
    ]}))
    assert r.parts == (Part("media", "user", "u", 0), Part("media", "user", '{"text":1,"type":["odd"]}', 0))


def test_the_reading_keeps_its_endpoint_and_not_n_or_best_of_as_params() -> None:
    c = read("chat", chat({"role": "user", "content": "x"}, n=2, best_of=3, temperature=0))
    p = read("completions", {"prompt": "x", "n": 2, "best_of": 3, "temperature": 0})
    assert (c.endpoint, p.endpoint) == ("chat", "completions")
    assert c.params == p.params == {"temperature": 0}
    assert read("chat", {"model": "auto", "messages": []}).parts == ()


def test_before_the_policy_sets_a_ceiling() -> None:
    r = read("chat", chat({"role": "user", "content": "hello"}))
    assert r.ceiling is None and r.output_tokens_max() == 0 and r.charge() == r.input_tokens == 2
    assert len(r.key()) == 64 and len(r.context_key()) == 64


def test_one_stored_text_replays_one_answer_without_tools_or_log_probabilities() -> None:
    """`cache_class`: 'never' for more than one answer, log-probabilities, echo, tools or an embedding;
    'deterministic' at temperature 0 or an integer seed (a bool is no seed); 'always' otherwise."""
    assert read("chat", chat({"role": "user", "content": "x"})).cache_class == "always"
    assert read("chat", chat({"role": "user", "content": "x"}, temperature=0)).cache_class == "deterministic"
    assert read("chat", chat({"role": "user", "content": "x"}, seed=3)).cache_class == "deterministic"
    assert read("chat", chat({"role": "user", "content": "x"}, seed=True)).cache_class == "always"
    assert read("chat", chat({"role": "user", "content": "x"}, n=2)).cache_class == "never"
    assert read("chat", chat({"role": "user", "content": "x"}, logprobs=True)).cache_class == "never"
    assert read("chat", chat({"role": "user", "content": "x"}, echo=True)).cache_class == "never"
    assert read("chat", chat({"role": "user", "content": "x"}, tools=[{"type": "function"}])).cache_class == "never"
    assert read("embeddings", {"input": "x"}).cache_class == "never"


def test_the_context_key_leaves_out_only_the_semantic_text() -> None:
    def context(*messages: dict[str, Any]) -> str:
        r = read("chat", chat(*messages))
        r.limit(32, r.stop)
        return r.context_key()

    user, sys_a, sys_b = {"role": "user", "content": "q"}, {"role": "system", "content": "a"}, \
        {"role": "system", "content": "b"}
    # a semantic text: the parts before it all count (not just the first)
    assert context({"role": "system", "content": "s"}, sys_a, user) != context({"role": "system", "content": "s"},
                                                                                 sys_b, user)
    # no semantic text (the last turn is the assistant's): the last part counts too
    assert context(user, {"role": "assistant", "content": "1"}) != context(user, {"role": "assistant", "content": "2"})
