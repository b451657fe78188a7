"""Limits toward clients over real sockets: body and header sizes, message count, slow senders,
and a client that stops reading a stream (the request ends, the upstream is cancelled, and what the
gateway buffers meanwhile stays bounded)."""

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.client_limits import ClientLimits
from gateway.stages.parse import MAX_MESSAGES
from gateway.testing import TEST_API_KEY, content, gateway_config, tier
from tests.conftest import StartApp, StartEmulator, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SHORT = ClientLimits(header_timeout_s=0.5, body_timeout_s=0.5, write_timeout_s=0.5)


@pytest.fixture
async def gateway(start_emulator: StartEmulator, start_gateway: StartGateway) -> str:
    emulator = await start_emulator()
    return await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])], policy={"max_body_bytes": 4096}))


def request_lines(logs: list[dict]) -> list[dict]:
    return [entry for entry in logs if entry["event"] == "request"]


async def raw_exchange(url: str, data: bytes, *, wait_s: float = 5.0) -> tuple[int, bytes]:
    """Send `data` on a raw connection and read one response: (status, body)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return int(head.split(b" ")[1]), await asyncio.wait_for(reader.readexactly(length), wait_s)
    finally:
        writer.close()


async def test_a_chunked_body_over_the_limit_is_refused_without_reading_it_all(gateway: str) -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"model": "t", "messages": [{"role": "user", "content": "'
        for _ in range(4096):  # 64 MiB if the gateway read it all
            sent += 16384
            yield b"x" * 16384

    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.post(f"{gateway}/v1/chat/completions", data=endless(),
                                        headers={**AUTH, "Content-Type": "application/json"}) as response:
                    status, body = response.status, await response.read()
            except aiohttp.ClientError:
                pytest.fail("the gateway should answer 413 before dropping the connection")
    assert status == 413
    assert orjson.loads(body)["error"]["code"] == "request_too_large"
    assert sent < 32 * 1024 * 1024
    [line] = request_lines(logs)
    assert (line["status"], line["outcome"]) == (413, "rejected")


async def test_a_body_that_trickles_in_gets_408_in_openai_shape(start_emulator: StartEmulator,
                                                                start_app: StartApp) -> None:
    emulator = await start_emulator()
    gateway = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])]), client_limits=SHORT))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_API_KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"model\"").encode()
    started = time.monotonic()
    with capture_logs() as logs:
        status, body = await raw_exchange(gateway, head)
    assert time.monotonic() - started < 3
    assert status == 408
    error = orjson.loads(body)["error"]
    assert error["code"] == "request_timeout" and error["type"] == "invalid_request_error"
    [line] = request_lines(logs)
    assert (line["status"], line["outcome"]) == (408, "rejected")


@pytest.mark.parametrize(("name", "headers"), [
    ("one header line over 8190 bytes", {"X-Big": "y" * 9000}),
    ("more than 128 headers", {f"X-H{i}": "1" for i in range(200)}),
])
async def test_oversized_headers_are_refused_and_the_gateway_keeps_serving(gateway: str, name: str,
                                                                           headers: dict[str, str]) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json=CHAT, headers={**AUTH, **headers}) as response:
            assert response.status in (400, 431), name
        async with session.post(f"{gateway}/v1/chat/completions", json=CHAT, headers=AUTH) as response:
            assert response.status == 200


async def test_too_many_messages_is_a_400_naming_the_field(start_emulator: StartEmulator,
                                                           start_gateway: StartGateway) -> None:
    emulator = await start_emulator()
    gateway = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])]))
    many = {**CHAT, "messages": [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json=many, headers=AUTH) as response:
            status, error = response.status, (await response.json())["error"]
    assert status == 400 and error["param"] == "messages" and str(MAX_MESSAGES) in error["message"]


async def test_a_client_trickling_its_headers_is_dropped(start_emulator: StartEmulator, start_app: StartApp) -> None:
    emulator = await start_emulator()
    gateway = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])]), client_limits=SHORT))
    host, port = gateway.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    started = time.monotonic()
    try:
        for piece in (b"POST /v1/chat/completions HTTP/1.1\r\n", b"Host: x\r\n", b"X-A: 1\r\n", b"X-B: 2\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.3)
        closed = await asyncio.wait_for(reader.read(), 1.5) == b""
    except ConnectionError:
        closed = True  # the gateway hung up while the headers were still coming
    except TimeoutError:
        closed = False
    finally:
        writer.close()
    assert closed and time.monotonic() - started < 3


def firehose(total_bytes: int, written: list[int], ended: list[str]) -> web.Application:
    """An upstream that streams `total_bytes` of content events as fast as its socket takes them."""
    piece = content("z" * 1000)

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        count = 0
        try:
            while count < total_bytes:
                await response.write(piece * 16)
                count += len(piece) * 16
                written[0] = count
            await response.write(b"data: [DONE]\n\n")
            ended.append("completed")
        except (ConnectionError, asyncio.CancelledError) as err:
            ended.append(type(err).__name__)
            raise
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def test_a_client_that_stops_reading_a_stream_is_dropped_and_the_upstream_cancelled(
        start_app: StartApp) -> None:
    total, written, ended = 256 * 1024 * 1024, [0], []
    upstream = await start_app(firehose(total, written, ended))
    gateway = await start_app(create_app(gateway_config([tier("t", [f"{upstream}/v1"])]), client_limits=SHORT))
    body = orjson.dumps({**CHAT, "stream": True})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    host, port = gateway.removeprefix("http://").split(":")
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection(host, int(port), limit=1024)
        writer.transport.pause_reading()  # take nothing: the kernel buffers fill, then the gateway's write waits
        writer.write(head + body)
        for _ in range(100):
            if request_lines(logs) and ended:
                break
            await asyncio.sleep(0.1)
        writer.close()
    assert any(entry["event"] == "client_write_timeout" for entry in logs)
    [line] = request_lines(logs)
    assert (line["status"], line["outcome"], line["error"]) == (499, "client_disconnected", "client_write_timeout")
    assert ended and ended[0] != "completed"  # the upstream saw the cancel
    # back-pressure: the upstream could push only what the sockets' buffers hold, not the whole stream
    assert written[0] < 64 * 1024 * 1024, written[0]
