"""How streams end (issue 18, items 1-4): a stream that delivered [DONE] is a 200 whatever the socket does
next; a finish reason or usage chunk the backend left out is supplied by the gateway; a hang-up is priced
for the tokens read from the backend. The official openai client against emulators and scripted upstreams."""

import asyncio
import time
from typing import Any

import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.state import GATEWAY
from gateway.context import RequestContext
from gateway.emulator.faults import FaultConfig
from gateway.testing import CHAT_STREAM, TEST_API_KEY, content, gateway_config, scripted_upstream, tier
from gateway.types import StreamReply
from tests.conftest import StartApp, StartEmulator, StartGateway

MESSAGES = [{"role": "user", "content": "Tell me about tail latency"}]
LLAMA_LIKE = FaultConfig(omit_finish_reason=True, omit_usage=True)  # what llama.cpp's server sometimes sends


async def request_lines(logs: list[dict[str, Any]], n: int = 1, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The request log lines once there are `n`: a handler whose client has left finishes a little later."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [entry for entry in logs if entry["event"] == "request"]
        if len(lines) >= n or time.monotonic() > deadline:
            assert len(lines) == n, lines
            return lines
        await asyncio.sleep(0.02)


async def emulated_client(start_emulator: StartEmulator, start_gateway: StartGateway,
                          faults: FaultConfig | None = None) -> tuple[AsyncOpenAI, Any]:
    emulator = await start_emulator(faults=faults)
    config = gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")])
    return AsyncOpenAI(base_url=f"{await start_gateway(config)}/v1", api_key=TEST_API_KEY), emulator


async def test_a_stream_the_client_closes_right_after_done_is_logged_200_ok(start_app: StartApp,
                                                                           start_gateway: StartGateway) -> None:
    # the upstream holds its connection open after [DONE]; the SDK closes its own as soon as it reads [DONE]
    upstream = await start_app(scripted_upstream([CHAT_STREAM], delay_s=1.0))
    gateway = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    client = AsyncOpenAI(base_url=f"{gateway}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model="t", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
        [line] = await request_lines(logs)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert (line["status"], line["outcome"], line["error"]) == (200, "ok", None)
    assert (line["completion_tokens"], line["finish_reason"]) == (3, "stop")


@pytest.mark.parametrize(("max_tokens", "expected"), [(4, "length"), (200, "stop")])
async def test_a_stream_without_a_finish_reason_gets_one(start_emulator: StartEmulator, start_gateway: StartGateway,
                                                         max_tokens: int, expected: str) -> None:
    client, emulator = await emulated_client(start_emulator, start_gateway, LLAMA_LIKE)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=max_tokens,
                                                      stream=True)
        chunks = [chunk async for chunk in stream]
        [line] = await request_lines(logs)
    [record] = emulator.engine.stats.records
    assert record.finish_reason == expected  # what the backend really ended with, and left out of its stream
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [expected] and chunks[-1].choices[0].finish_reason == expected
    assert (line["status"], line["outcome"], line["finish_reason"]) == (200, "ok", expected)
    assert line["error"] == "upstream_missing_finish"
    [warning] = [entry for entry in logs if entry["event"] == "upstream_missing_finish"]
    assert (warning["request_id"], warning["finish_reason"]) == (line["request_id"], expected)


async def test_usage_is_sent_from_the_gateways_counts_when_the_backend_sends_none(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    client, emulator = await emulated_client(start_emulator, start_gateway, LLAMA_LIKE)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=12, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        [line] = await request_lines(logs)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    [record] = emulator.engine.stats.records
    assert (usage.prompt_tokens, usage.completion_tokens) == (record.prompt_tokens, record.sent_tokens)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens == sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert (line["prompt_tokens"], line["completion_tokens"], line["usage_source"]) == (
        usage.prompt_tokens, usage.completion_tokens, "counted")
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")  # the finish chunk comes before usage


async def test_no_usage_chunk_when_the_client_did_not_ask(start_emulator: StartEmulator,
                                                          start_gateway: StartGateway) -> None:
    client, _ = await emulated_client(start_emulator, start_gateway, LLAMA_LIKE)
    stream = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=12, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)


async def test_an_output_capped_stream_gets_usage_when_asked(start_emulator: StartEmulator,
                                                              start_app: StartApp) -> None:
    from tests.integration.test_output_cap import capped

    emulator = await start_emulator("int4")  # the backend's own usage never comes: the cap cancels it
    config = capped(gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")]), tokens=5)
    client = AsyncOpenAI(base_url=f"{await start_app(create_app(config))}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=400, stream=True,
                                                      stream_options={"include_usage": True},
                                                      extra_body={"ignore_eos": True})
        chunks = [chunk async for chunk in stream]
        [line] = await request_lines(logs)
    assert chunks[-2].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 5
    assert (line["prompt_tokens"], line["completion_tokens"], line["output_capped"]) == (
        usage.prompt_tokens, 5, True)


async def test_a_hang_up_is_priced_for_the_tokens_read_from_the_backend(start_app: StartApp) -> None:
    """The edge's part played by hand: the client takes the first chunk and hangs up while the rest of the
    answer has already arrived from the backend (read, not yet forwarded); then the edge's `finally`."""
    rest = b"".join(content(word) for word in ("b", "c", "d", "e", "f"))
    upstream = await start_app(scripted_upstream([content("a"), rest, b": still generating\n\n"], delay_s=0.2))
    app = create_app(gateway_config([tier("t", [f"{upstream}/v1"], output_per_mtok=1e6)]))
    await start_app(app)
    gateway = app[GATEWAY]
    ctx = RequestContext("r1", "chat", gateway.config,
                         b'{"model": "t", "stream": true, "messages": [{"role": "user", "content": "hello there"}]}',
                         TEST_API_KEY, time.perf_counter(), time.time())
    with capture_logs() as logs:
        assert gateway.path is not None
        reply = await gateway.path.run(ctx)
        assert isinstance(reply, StreamReply)
        chunks = reply.source.chunks()
        assert await anext(chunks) == content("a")
        await asyncio.sleep(0.3)  # "b" to "f" arrive while the client is gone
        ctx.result.status, ctx.result.outcome = 499, "client_disconnected"
        reply.source.close()
        gateway.path.finish(ctx)
        [line] = await request_lines(logs)
    assert (line["status"], line["outcome"]) == (499, "client_disconnected")
    assert line["completion_tokens"] == 6  # the client got 1 token; the backend had sent 6
    assert line["cost_usd"] == pytest.approx(line["prompt_tokens"] * 1e-6 + 6.0)
