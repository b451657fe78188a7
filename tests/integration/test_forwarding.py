"""Byte-level SSE forwarding, client disconnects and failover, against real servers on loopback."""

import asyncio

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.emulator.faults import FaultConfig
from gateway.testing import (
    CHAT_STREAM, SEEN, TEST_API_KEY, USAGE_EVENT, content, gateway_config, scripted_upstream, tier,
)
from tests.conftest import StartApp, StartEmulator, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


async def post_stream(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers or AUTH) as response:
            return response.status, await response.read(), response.headers


@pytest.mark.parametrize("piece_size", [1, 5, 64, len(CHAT_STREAM)])
async def test_sse_bytes_are_forwarded_exactly(start_app: StartApp, start_gateway: StartGateway,
                                               piece_size: int) -> None:
    pieces = [CHAT_STREAM[i:i + piece_size] for i in range(0, len(CHAT_STREAM), piece_size)]
    app = scripted_upstream(pieces)
    upstream = await start_app(app)
    gateway = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    with capture_logs() as logs:
        status, got, headers = await post_stream(gateway, {**CHAT, "stream": True,
                                                           "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert got == CHAT_STREAM
    assert app[SEEN][0]["stream_options"] == {"include_usage": True}
    assert app[SEEN][0]["model"] == "emulated"  # the replica's upstream model name
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["prompt_tokens"], line["completion_tokens"], line["finish_reason"]) == (4, 3, "stop")


async def test_usage_event_is_removed_when_the_client_did_not_ask(start_app: StartApp,
                                                                   start_gateway: StartGateway) -> None:
    upstream = await start_app(scripted_upstream([CHAT_STREAM]))
    gateway = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    _, got, _ = await post_stream(gateway, {**CHAT, "stream": True})
    assert got == CHAT_STREAM.replace(USAGE_EVENT, b"")


async def test_counted_usage_when_the_backend_reports_none(start_app: StartApp, start_gateway: StartGateway) -> None:
    upstream = await start_app(scripted_upstream([CHAT_STREAM.replace(USAGE_EVENT, b"")]))
    gateway = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    with capture_logs() as logs:
        await post_stream(gateway, {**CHAT, "stream": True})
    line = next(entry for entry in logs if entry["event"] == "request")
    assert line["usage_source"] == "counted"
    assert line["completion_tokens"] == 3  # chunks with content
    assert line["prompt_tokens"] == 2  # "hello there" in the WordPiece tokenizer
    assert line["cost_usd"] == pytest.approx((2 * 1.0 + 3 * 2.0) / 1e6)


async def test_truncated_upstream_stream_ends_with_an_error_event(start_app: StartApp,
                                                                  start_gateway: StartGateway) -> None:
    upstream = await start_app(scripted_upstream([content("a"), content("b")]))  # no [DONE]
    gateway = await start_gateway(gateway_config([tier("t", [f"{upstream}/v1"])]))
    with capture_logs() as logs:
        status, got, _ = await post_stream(gateway, {**CHAT, "stream": True})
    assert status == 200
    assert got.startswith(content("a") + content("b"))
    error = orjson.loads(got.split(b"\n\n")[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_stream_truncated"
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["outcome"], line["error"], line["completion_tokens"]) == ("upstream_error", "upstream_stream_truncated", 2)


async def test_client_disconnect_cancels_the_upstream(start_emulator: StartEmulator,
                                                      start_gateway: StartGateway) -> None:
    emulator = await start_emulator("int4")
    gateway = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])]))
    body = {**CHAT, "stream": True, "max_tokens": 2000, "ignore_eos": True}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
                async for _ in response.content.iter_any():
                    break  # first bytes seen: hang up
        for _ in range(100):
            if emulator.engine.stats.cancelled and any(e["event"] == "request" for e in logs):
                break
            await asyncio.sleep(0.05)
    assert emulator.engine.stats.cancelled == 1
    assert emulator.engine.num_running == 0
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["status"], line["outcome"]) == (499, "client_disconnected")
    assert 0 < line["completion_tokens"] < 2000


async def test_failover_before_the_first_byte(start_emulator: StartEmulator, start_gateway: StartGateway,
                                              unused_tcp_port: int) -> None:
    failing = await start_emulator(faults=FaultConfig(error_rate=1.0))
    healthy = await start_emulator()
    dead = f"http://127.0.0.1:{unused_tcp_port}/v1"
    config = gateway_config([tier("t", [dead, f"{failing.url}/v1", f"{healthy.url}/v1"])])
    gateway = await start_gateway(config)
    with capture_logs() as logs:
        status, got, headers = await post_stream(gateway, {**CHAT, "stream": True})
    assert status == 200 and got.endswith(b"data: [DONE]\n\n")
    assert headers["x-gateway-backend"] == "t-2"
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["attempts"], line["backend"], line["outcome"]) == (3, "t-2", "ok")
    assert sum(entry["event"] == "upstream_attempt_failed" for entry in logs) == 2


async def test_all_replicas_failing_gives_502_in_openai_shape(start_emulator: StartEmulator,
                                                              start_gateway: StartGateway,
                                                              unused_tcp_port: int) -> None:
    failing = await start_emulator(faults=FaultConfig(error_rate=1.0))
    dead = f"http://127.0.0.1:{unused_tcp_port}/v1"
    gateway = await start_gateway(gateway_config([tier("t", [dead, f"{failing.url}/v1"])]))
    with capture_logs() as logs:
        status, got, _ = await post_stream(gateway, CHAT)
    assert status == 502
    assert orjson.loads(got)["error"]["type"] == "upstream_error"
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["status"], line["outcome"], line["cost_usd"]) == (502, "upstream_error", 0.0)


async def test_backend_rate_limits_pass_on_retry_after(start_emulator: StartEmulator,
                                                       start_gateway: StartGateway) -> None:
    limited = await start_emulator(faults=FaultConfig(rate_limit_rate=1.0, retry_after_s=7))
    gateway = await start_gateway(gateway_config([tier("t", [f"{limited.url}/v1"])]))
    status, got, headers = await post_stream(gateway, CHAT)
    assert status == 503 and headers["Retry-After"] == "7"
    assert "429" in orjson.loads(got)["error"]["message"]


async def test_mid_stream_backend_disconnect_is_an_error_event(start_emulator: StartEmulator,
                                                               start_gateway: StartGateway) -> None:
    broken = await start_emulator(faults=FaultConfig(disconnect_after_tokens=3))
    gateway = await start_gateway(gateway_config([tier("t", [f"{broken.url}/v1"])]))
    with capture_logs() as logs:
        status, got, _ = await post_stream(gateway, {**CHAT, "stream": True, "max_tokens": 50, "ignore_eos": True})
    assert status == 200
    assert b'"type":"upstream_error"' in got and not got.endswith(b"data: [DONE]\n\n")
    line = next(entry for entry in logs if entry["event"] == "request")
    assert line["outcome"] == "upstream_error" and line["completion_tokens"] == 3
