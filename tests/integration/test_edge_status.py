"""The edge's last-resort statuses and their log lines (gateway/http.py `serve`): a client that resets the
connection is logged 499 `client_disconnected`, never as served or as an error of ours; a bug inside the
request path answers 500 in the OpenAI error shape, logs `internal_error` with its traceback, and the request's
line says 500 `internal_error`."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.context import RequestContext
from gateway.routing.ranking import RankStage
from gateway.testing import TEST_API_KEY, content, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


async def request_line(logs: list[dict[str, Any]], timeout_s: float = 5.0) -> dict[str, Any]:
    """The request's log line (written in the edge's `finally`, which may run after the client has gone)."""
    for _ in range(int(timeout_s / 0.02)):
        lines = [e for e in logs if e["event"] == "request"]
        if lines:
            (line,) = lines
            return line
        await asyncio.sleep(0.02)
    raise AssertionError("no request line")


async def gateway_whose_path_raises(start_emulator: StartEmulator, start_app: StartApp,
                                    monkeypatch: pytest.MonkeyPatch, error: BaseException) -> str:
    """A gateway whose request path raises `error` in a stage (the ranking, which every routed request passes
    through): what a stage's bug, or the client's socket failing under a stage, looks like to the edge."""
    emulator = await start_emulator()
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])])))

    async def raising(self: RankStage, ctx: RequestContext) -> Any:
        raise error

    monkeypatch.setattr(RankStage, "__call__", raising)
    return url


async def test_a_bug_in_the_request_path_answers_500_and_logs_it(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins: the internal-error path answers 500 (not 200), in the OpenAI error shape naming the request id; the
    traceback is logged as `internal_error`; the request line says status 500, outcome `internal_error`."""
    url = await gateway_whose_path_raises(start_emulator, start_app, monkeypatch, RuntimeError("a stage's bug"))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH) as response:
                status, body, request_id = response.status, orjson.loads(await response.read()), \
                    response.headers["x-request-id"]
        line = await request_line(logs)
    assert status == 500
    assert body["error"]["type"] == "api_error" and f"internal error (request {request_id})" in body["error"]["message"]
    assert "a stage's bug" not in orjson.dumps(body).decode()  # the exception's text stays in the log
    (logged,) = [e for e in logs if e["event"] == "internal_error"]
    assert logged["request_id"] == request_id and logged["log_level"] == "error" and logged.get("exc_info")
    assert (line["request_id"], line["status"], line["outcome"]) == (request_id, 500, "internal_error")
    assert line["cost_usd"] == 0


async def test_a_connection_reset_under_the_request_path_is_logged_499(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pins: ConnectionResetError reaching the edge is the client's doing: the request line says 499
    `client_disconnected` (not 500 `internal_error`, not 200), and no `internal_error` is logged."""
    url = await gateway_whose_path_raises(start_emulator, start_app, monkeypatch, ConnectionResetError("peer reset"))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", json=CHAT, headers=AUTH) as response:
                status = response.status
        line = await request_line(logs)
    assert status == 499
    assert (line["status"], line["outcome"]) == (499, "client_disconnected")
    assert not [e for e in logs if e["event"] == "internal_error"]


def slow_upstream() -> web.Application:
    """Streams a token every 50 ms, 200 of them."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(200):
            await response.write(content(f"w{i} "))
            await asyncio.sleep(0.05)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def test_a_client_resetting_mid_stream_is_logged_499(start_app: StartApp) -> None:
    """A real reset: the client reads the first bytes of a stream, then closes its socket with RST (SO_LINGER 0);
    the gateway's next write to it fails. The line says 499 `client_disconnected`, with the tokens read so far."""
    upstream = await start_app(slow_upstream())
    url = await start_app(create_app(gateway_config([tier("t", [f"{upstream}/v1"])])))
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 200})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TEST_API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with capture_logs() as logs:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head + body)
        await writer.drain()
        first = await reader.readuntil(b"w1 ")  # the head and two tokens
        assert first.startswith(b"HTTP/1.1 200")
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        writer.transport.abort()
        line = await request_line(logs)
    assert (line["status"], line["outcome"]) == (499, "client_disconnected"), line
    assert 2 <= line["completion_tokens"] < 200
    assert not [e for e in logs if e["event"] == "internal_error"]
