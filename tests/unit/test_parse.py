"""Each malformed body is refused with a 4xx that names the field at fault."""

import json
import time
from typing import Any

import orjson
import pytest

from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.stages.parse import ParseStage
from gateway.testing import gateway_config, tier
from gateway.types import Endpoint

CONFIG = gateway_config([tier("small", ["http://127.0.0.1:1/v1"])])
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}


def context(body: Any, endpoint: Endpoint = "chat") -> RequestContext:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return RequestContext("r", endpoint, CONFIG, raw, None, time.perf_counter(), time.time())


async def parse(body: Any, endpoint: Endpoint = "chat") -> RequestContext:
    ctx = context(body, endpoint)
    assert await ParseStage()(ctx) is None
    return ctx


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"", None),
        (b"{not json", None),
        (b"[1, 2]", None),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({**CHAT, "model": 5}, "model"),
        ({"model": "auto"}, "messages"),
        ({"model": "auto", "messages": []}, "messages"),
        ({"model": "auto", "messages": "hi"}, "messages"),
        ({"model": "auto", "messages": ["hi"]}, "messages[0]"),
        ({"model": "auto", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "auto", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "auto", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({**CHAT, "max_tokens": -1}, "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "max_tokens": "10"}, "max_tokens"),
        ({**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ({**CHAT, "max_tokens": True}, "max_tokens"),
        ({**CHAT, "max_tokens": 10**12}, "max_tokens"),
        ({**CHAT, "max_completion_tokens": -5}, "max_completion_tokens"),
        ({**CHAT, "stream": "yes"}, "stream"),
        ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ({**CHAT, "stream": True, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ({**CHAT, "stream": True, "stream_options": [1]}, "stream_options"),
        ({**CHAT, "temperature": 3}, "temperature"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "top_p": -0.1}, "top_p"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({**CHAT, "seed": "x"}, "seed"),
    ],
)
async def test_bad_chat_bodies_name_the_field(body: Any, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await parse(body)
    assert caught.value.status == 400
    assert caught.value.param == param
    if param:
        assert param.split("[")[0].split(".")[0] in caught.value.message


@pytest.mark.parametrize("prompt", [None, "", [], [1, "a"], [[1], "a"], 3, {"a": 1}])
async def test_bad_completion_prompts(prompt: Any) -> None:
    body = {"model": "auto"} if prompt is None else {"model": "auto", "prompt": prompt}
    if prompt == "":
        await parse(body, "completions")  # an empty string is a valid (if useless) prompt
        return
    with pytest.raises(InvalidRequest) as caught:
        await parse(body, "completions")
    assert caught.value.param == "prompt"


async def test_valid_body_fills_the_context_and_keeps_unknown_fields() -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "max_completion_tokens": 9,
            "max_tokens": 20, "tools": [{"type": "function"}], "response_format": {"type": "json_object"}}
    ctx = await parse(body)
    assert (ctx.model_requested, ctx.stream, ctx.client_wants_usage, ctx.max_tokens) == ("auto", True, True, 9)
    assert ctx.body["tools"] == [{"type": "function"}]
    assert ctx.body["response_format"] == {"type": "json_object"}


async def test_prompt_text_joins_text_parts() -> None:
    ctx = await parse({"model": "auto", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "image_url", "image_url": {}}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]})
    assert ctx.prompt_text() == "be brief\npart one"


MAX_DEPTH = 64  # README: JSON may nest at most 64 levels (the body object is one)


def nested(depth: int) -> Any:
    """`depth` arrays, one inside the other: [[[...]]]."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("field", ["x", "messages", "tools"])
async def test_a_body_nested_beyond_the_limit_is_refused_naming_the_field(field: str) -> None:
    body = {**CHAT, field: nested(300)} if field != "messages" else {
        "model": "auto", "messages": [{"role": "user", "content": "hi", "x": nested(300)}]}
    with pytest.raises(InvalidRequest) as caught:
        await parse(json.dumps(body).encode())  # orjson writes no more than 254 levels
    assert caught.value.status == 400 and caught.value.param == field
    assert f"{MAX_DEPTH} levels" in caught.value.message


async def test_a_body_nested_up_to_the_limit_is_accepted_and_encodes_again() -> None:
    ctx = await parse({**CHAT, "x": nested(MAX_DEPTH - 1)})  # the body object is one level
    assert orjson.loads(orjson.dumps(ctx.body)) == ctx.body
    with pytest.raises(InvalidRequest):
        await parse({**CHAT, "x": nested(MAX_DEPTH)})
