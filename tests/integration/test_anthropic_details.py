"""Anthropic Messages details through the official `anthropic` SDK: a stop at one of `stop_sequences` comes back
as stop_reason "stop_sequence" with the sequence (streaming and not), an unknown model is a 404 not_found_error,
and /v1/messages/count_tokens answers {"input_tokens": N} with the tier's own tokenizer."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import orjson
import pytest
from aiohttp import web

from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator, StartGateway

WORDS = ["The", " answer", " is", " 42", ".", " END", " and", " more", " text"]


def vllm_like() -> web.Application:
    """An upstream that honours `stop` as vLLM does: the text ends before the first stop string found, the
    finish reason is "stop" and `stop_reason` names the string (null when the model ended on its own)."""

    def answer(body: dict[str, Any]) -> tuple[list[str], str | None]:
        stops = body.get("stop") or []
        text = ""
        for i, word in enumerate(WORDS):
            for stop in stops:
                at = (text + word).find(stop)
                if at >= 0:
                    cut = (text + word)[:at]
                    return ([*WORDS[:i], cut[len(text):]] if cut[len(text):] else WORDS[:i]), stop
            text += word
        return WORDS, None

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        words, stop = answer(body)
        usage = {"prompt_tokens": 11, "completion_tokens": len(words), "total_tokens": 11 + len(words)}
        finish = {"index": 0, "finish_reason": "stop", "stop_reason": stop}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(words)}
            return web.json_response({"id": "c", "object": "chat.completion", "created": int(time.time()),
                                      "model": "m", "choices": [{**finish, "message": message}], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(data: dict[str, Any]) -> None:
            await response.write(b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk",
                                                           "created": 1, "model": "m", **data}) + b"\n\n")

        for word in words:
            await event({"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]})
        await event({"choices": [{**finish, "delta": {}}]})
        await event({"choices": [], "usage": usage})
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def claude(start_app: StartApp, start_gateway: StartGateway) -> anthropic.AsyncAnthropic:
    upstream = await start_app(vllm_like())
    url = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    return anthropic.AsyncAnthropic(base_url=url, api_key=TEST_API_KEY)


async def test_a_stop_sequence_is_said_with_its_sequence(claude: anthropic.AsyncAnthropic) -> None:
    ask: dict[str, Any] = {"model": "t", "max_tokens": 50, "messages": [{"role": "user", "content": "Answer?"}]}
    message = await claude.messages.create(**ask, stop_sequences=["STOP", " END"])
    assert message.content[0].type == "text" and message.content[0].text == "The answer is 42."
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " END")
    async with claude.messages.stream(**ask, stop_sequences=["42"]) as stream:
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "The answer is "
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "42")
    ended = await claude.messages.create(**ask, stop_sequences=["never"])  # the model ended on its own
    assert (ended.stop_reason, ended.stop_sequence) == ("end_turn", None)
    async with claude.messages.stream(**ask) as stream:
        assert ((await stream.get_final_message()).stop_reason, stream.current_message_snapshot.stop_sequence) == (
            "end_turn", None)


async def test_an_unknown_model_is_not_found_in_anthropic_shape(claude: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await claude.messages.create(model="claude-nope", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "not_found_error"
    assert "'claude-nope'" in body["error"]["message"]


@pytest.fixture
async def emulated(start_emulator: StartEmulator, start_gateway: StartGateway) -> anthropic.AsyncAnthropic:
    emulator = await start_emulator(seed=3)
    config = gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")])
    return anthropic.AsyncAnthropic(base_url=await start_gateway(config), api_key=TEST_API_KEY)


async def test_count_tokens_counts_what_the_backend_will_read(emulated: anthropic.AsyncAnthropic) -> None:
    turns: list[Any] = [{"role": "user", "content": "Tell me about tail latency in three sentences"},
                        {"role": "assistant", "content": "Gladly."},
                        {"role": "user", "content": [{"type": "text", "text": "Go on."}]}]
    counted = await emulated.messages.count_tokens(model="t", system="Be brief.", messages=turns)
    answered = await emulated.messages.create(model="t", system="Be brief.", messages=turns, max_tokens=3)
    assert counted.input_tokens == answered.usage.input_tokens > 0  # the emulator's own count of the prompt
    by_auto = await emulated.messages.count_tokens(model="auto", system="Be brief.", messages=turns)
    assert by_auto.input_tokens == counted.input_tokens  # auto counts with the default tier, t
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await emulated.messages.count_tokens(model="nope", messages=turns)
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        await emulated.messages.count_tokens(model="t", messages=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    assert "messages[0].role" in bad.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        await anthropic.AsyncAnthropic(base_url=str(emulated.base_url), api_key="sk-wrong").messages.count_tokens(
            model="t", messages=turns)


async def test_a_cached_answer_keeps_its_stop_sequence(start_app: StartApp, redis_url: str) -> None:
    from gateway.app import create_app

    upstream = await start_app(vllm_like())
    config = gateway_config([tier("t", [f"{upstream}/v1"])])
    url = await start_app(create_app(config, redis_url=redis_url))
    claude = anthropic.AsyncAnthropic(base_url=url, api_key=TEST_API_KEY)
    ask: dict[str, Any] = {"model": "t", "max_tokens": 50, "extra_body": {"temperature": 0},  # cached when 0
                           "stop_sequences": [" END"], "messages": [{"role": "user", "content": "Answer, cached?"}]}
    first = await claude.messages.with_raw_response.create(**ask)
    again = await claude.messages.with_raw_response.create(**ask)
    assert again.headers.get("x-gateway-cache") == "hit" != first.headers.get("x-gateway-cache")
    for raw in (first, again):
        message = await raw.parse()
        assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " END")
    async with claude.messages.stream(**{**ask, "messages": [{"role": "user", "content": "Streamed, cached?"}]}) as s:
        await s.get_final_message()
    async with claude.messages.stream(**{**ask, "messages": [{"role": "user", "content": "Streamed, cached?"}]}) as s:
        final = await s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", " END")
