"""Upstream timeouts: no first byte in time fails over; a stream that goes quiet ends with an error event."""

import asyncio
import time

import aiohttp
import orjson
from aiohttp import web
from structlog.testing import capture_logs

from gateway.testing import TEST_API_KEY, content, gateway_config, tier
from tests.conftest import StartApp, StartGateway

BODY = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def upstream(first_delay_s: float, pieces: list[bytes], then_stall_s: float) -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(first_delay_s)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
        await asyncio.sleep(then_stall_s)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def stream(url: str) -> bytes:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=BODY,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            return await response.read()


async def test_a_stream_that_goes_quiet_ends_with_an_idle_timeout(start_app: StartApp,
                                                                  start_gateway: StartGateway) -> None:
    quiet = await start_app(upstream(0.0, [content("a"), content("b")], then_stall_s=10))
    gateway = await start_gateway(gateway_config([tier("t", [f"{quiet}/v1"])], upstream={"read_timeout_s": 0.3}))
    started = time.monotonic()
    with capture_logs() as logs:
        got = await stream(gateway)
    assert time.monotonic() - started < 3  # the watchdog sweeps once a second
    assert got.startswith(content("a") + content("b"))
    assert orjson.loads(got.split(b"\n\n")[-2].removeprefix(b"data: "))["error"]["code"] == "upstream_idle_timeout"
    line = next(e for e in logs if e["event"] == "request")
    assert (line["outcome"], line["error"], line["completion_tokens"]) == ("upstream_error", "upstream_idle_timeout", 2)


async def test_no_first_byte_in_time_fails_over_to_the_next_replica(start_app: StartApp,
                                                                    start_gateway: StartGateway) -> None:
    slow = await start_app(upstream(10.0, [content("never")], then_stall_s=0))
    fast = await start_app(upstream(0.0, [content("ok", "stop")], then_stall_s=0))
    config = gateway_config([tier("t", [f"{slow}/v1", f"{fast}/v1"])], upstream={"read_timeout_s": 0.3})
    gateway = await start_gateway(config)
    with capture_logs() as logs:
        got = await stream(gateway)
    assert got == content("ok", "stop") + b"data: [DONE]\n\n"
    line = next(e for e in logs if e["event"] == "request")
    assert (line["attempts"], line["backend"], line["outcome"]) == (2, "t-1", "ok")
