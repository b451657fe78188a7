"""Issue 19: /v1/responses (openai), /v1/messages (anthropic) and ChatOpenAI (langchain-openai) through the
gateway to emulators, as applications call them: answers, usage equal to the log line, protocol error shapes."""

import asyncio
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from langchain_openai import ChatOpenAI
from aiohttp import web
from openai import AsyncOpenAI, BadRequestError
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator, StartGateway
from tests.integration.test_stream_endings import request_lines

PRICES = (1.0, 2.0)  # the test tier's input and output USD per million tokens


@pytest.fixture
async def base_url(start_emulator: StartEmulator, start_gateway: StartGateway) -> str:
    emulator = await start_emulator(seed=3)
    config = gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")])
    return await start_gateway(config)


def assert_logged(line: dict[str, Any], prompt: int, completion: int) -> None:
    """The log line's tokens and cost are those the client was told."""
    assert (line["status"], line["outcome"], line["prompt_tokens"], line["completion_tokens"]) == (
        200, "ok", prompt, completion)
    assert prompt > 0 and completion > 0
    assert line["cost_usd"] == pytest.approx((prompt * PRICES[0] + completion * PRICES[1]) / 1e6)


async def test_responses_create(base_url: str) -> None:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        response = await client.responses.create(model="t", input="Tell me about tail latency",
                                                 instructions="Be brief.", max_output_tokens=9)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text and response.usage is not None and response.usage.output_tokens == 9
    [line] = await request_lines(logs)
    assert_logged(line, response.usage.input_tokens, response.usage.output_tokens)


async def test_responses_stream_event_sequence_and_usage(base_url: str) -> None:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        stream = await client.responses.create(
            model="t", input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}],
            max_output_tokens=200, stream=True)
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    done = events[-1].response
    assert deltas and "".join(deltas) == done.output_text == events[-4].text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [line] = await request_lines(logs)
    assert done.usage is not None and done.usage.output_tokens == len(deltas)
    assert_logged(line, done.usage.input_tokens, done.usage.output_tokens)


async def test_responses_bad_input_is_an_openai_400_naming_the_field(base_url: str) -> None:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key=TEST_API_KEY)
    for kwargs, param in (({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
                          ({"input": [{"role": "tool", "content": "x"}]}, "input[0]"),
                          ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
                          ({"input": "hi", "store": True}, "store")):
        with pytest.raises(BadRequestError) as caught:
            await client.responses.create(model="t", **kwargs)
        assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]


async def test_messages_create_and_stream(base_url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        message = await client.messages.create(
            model="t", max_tokens=7, system="Be brief.", stop_sequences=["\n\n\n"],
            messages=[{"role": "user", "content": "Tell me about tail latency"}])
        async with client.messages.stream(model="t", max_tokens=300, messages=[
                {"role": "user", "content": [{"type": "text", "text": "Hello"}]}]) as stream:
            pieces = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    assert message.content[0].type == "text" and message.content[0].text
    assert (message.stop_reason, message.usage.output_tokens) == ("max_tokens", 7)
    assert final.stop_reason == "end_turn" and "".join(pieces) == final.content[0].text
    assert final.usage.output_tokens == len(pieces)
    plain, streamed = await request_lines(logs, 2)
    assert_logged(plain, message.usage.input_tokens, 7)
    assert_logged(streamed, final.usage.input_tokens, final.usage.output_tokens)


async def test_messages_errors_in_anthropic_shape(base_url: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=TEST_API_KEY)
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model="t", max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert "messages[0].content[0]" in caught.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await anthropic.AsyncAnthropic(base_url=base_url, api_key="sk-wrong").messages.create(
            model="t", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v1/messages", json={"model": "t", "messages": []},
                                headers={"x-api-key": TEST_API_KEY, "anthropic-version": "2023-06-01"}) as response:
            body = await response.json()
    assert response.status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "'max_tokens'" in body["error"]["message"]


async def test_langchain_chat_openai_invoke_and_stream(base_url: str) -> None:
    chat = ChatOpenAI(model="t", base_url=f"{base_url}/v1", api_key=TEST_API_KEY, max_tokens=8,  # type: ignore[arg-type]
                      stream_usage=True)
    with capture_logs() as logs:
        answer = await chat.ainvoke("Tell me about tail latency")
        chunks = [chunk async for chunk in chat.astream("And about queues?")]
    assert answer.content and answer.usage_metadata is not None and answer.usage_metadata["output_tokens"] == 8
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    assert streamed.content and streamed.usage_metadata is not None
    plain, stream_line = await request_lines(logs, 2)
    assert_logged(plain, answer.usage_metadata["input_tokens"], 8)
    assert_logged(stream_line, streamed.usage_metadata["input_tokens"], streamed.usage_metadata["output_tokens"])


async def test_deterministic_requests_are_answered_from_the_response_cache(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    emulator = await start_emulator(seed=3)
    config = gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")])
    base = await start_app(create_app(config, redis_url=redis_url))
    claude = anthropic.AsyncAnthropic(base_url=base, api_key=TEST_API_KEY)
    openai = AsyncOpenAI(base_url=f"{base}/v1", api_key=TEST_API_KEY)
    ask = {"model": "t", "max_tokens": 12, "extra_body": {"temperature": 0},  # this SDK has no temperature argument
           "messages": [{"role": "user", "content": "Cache me"}]}
    with capture_logs() as logs:
        first = await claude.messages.create(**ask)  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # the store is written behind the answer
        again = await claude.messages.with_raw_response.create(**ask)  # type: ignore[arg-type]
        streamed = await openai.responses.create(model="t", input="Cache me", max_output_tokens=12, temperature=0,
                                                 stream=True)
        events = [event async for event in streamed]
    assert again.headers["x-gateway-cache"] == "hit" and (await again.parse()).content == first.content
    done = events[-1].response  # the same answer (a chat body underneath), replayed as Responses events
    assert done.output_text == first.content[0].text and done.usage.output_tokens == first.usage.output_tokens
    lines = await request_lines(logs, 3)
    assert [line["cache"] for line in lines] == ["miss", "hit", "hit"]


def native_backend(seen: list[dict[str, Any]]) -> web.Application:
    """A backend serving /v1/responses itself (as vLLM does): a fixed two-piece answer and its usage."""
    usage = {"input_tokens": 7, "output_tokens": 2, "total_tokens": 9}
    done = {"id": "resp_up", "object": "response", "status": "completed", "model": "m", "usage": usage,
            "output": [{"type": "message", "id": "msg_up", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "native answer", "annotations": []}]}]}

    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if not body.get("stream"):
            return web.json_response(done)
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        events = [{"type": "response.created", "response": {**done, "status": "in_progress", "output": []}},
                  *({"type": "response.output_text.delta", "item_id": "msg_up", "output_index": 0, "content_index": 0,
                     "delta": piece} for piece in ("native", " answer")),
                  {"type": "response.completed", "response": done}]
        for i, event in enumerate(events):
            await reply.write(f"event: {event['type']}\ndata: {orjson.dumps({**event, 'sequence_number': i}).decode()}"
                              "\n\n".encode())
        return reply

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    return app


async def test_a_tier_serving_responses_natively_gets_the_request_as_sent(start_app: StartApp) -> None:
    seen: list[dict[str, Any]] = []
    upstream = await start_app(native_backend(seen))
    native = tier("n", [f"{upstream}/v1"]).model_copy(update={"native": ("responses",)})
    client = AsyncOpenAI(base_url=f"{await start_app(create_app(gateway_config([native])))}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        plain = await client.responses.create(model="n", input="Hi", max_output_tokens=5000)
        stream = await client.responses.create(model="n", input="Hi", instructions="Be brief.", stream=True)
        events = [event async for event in stream]
    assert [body["model"] for body in seen] == ["emulated", "emulated"]  # the replica's model name
    assert seen[0]["input"] == "Hi" and seen[0]["max_output_tokens"] == 1024  # the tenant's maximum applied
    assert seen[1]["instructions"] == "Be brief." and "messages" not in seen[1]
    assert plain.output_text == "native answer" and plain.id == "resp_up"  # the backend's own object
    assert [e.type for e in events] == ["response.created", *["response.output_text.delta"] * 2, "response.completed"]
    for line in await request_lines(logs, 2):
        assert (line["prompt_tokens"], line["completion_tokens"], line["usage_source"]) == (7, 2, "backend")
        assert line["cost_usd"] == pytest.approx((7 * PRICES[0] + 2 * PRICES[1]) / 1e6)
        assert (line["status"], line["outcome"], line["finish_reason"]) == (200, "ok", "stop")
