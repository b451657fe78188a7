"""The request log's status paths at the edge (gateway/http.py `serve`, `_stream`, `_write_behind`, `_error`),
pinned for the mutants of the request-log-status target (issue 42): the status, body, headers and content type
each path answers with, and the status, outcome and error the request's log line says. A real gateway on
loopback with the request path's `run` replaced where a test needs a reply or an error no backend gives."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

from multidict import CIMultiDict
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

import gateway.http as http
from gateway.app import create_app
from gateway.context import RequestContext
from gateway.pipeline import RequestPath
from gateway.errors import GatewayError, Overloaded, UpstreamError, error_body
from gateway.protocols import WIRES
from gateway.routing.sessions import SESSION_HEADER
from gateway.state import GATEWAY
from gateway.testing import TEST_API_KEY, gateway_config, tier
from gateway.types import JsonReply, StreamReply
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
MESSAGES = {"model": "t", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]}


async def request_line(logs: list[dict[str, Any]], timeout_s: float = 5.0) -> dict[str, Any]:
    """The request's one log line (written in the edge's `finally`, maybe after the client has gone)."""
    for _ in range(int(timeout_s / 0.02)):
        lines = [e for e in logs if e["event"] == "request"]
        if lines:
            (line,) = lines
            return line
        await asyncio.sleep(0.02)
    raise AssertionError("no request line")


async def started(start_emulator: StartEmulator, start_app: StartApp) -> tuple[str, web.Application]:
    emulator = await start_emulator()
    app = create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])]))
    return await start_app(app), app


async def post(url: str, path: str, body: dict, headers: dict[str, str]) -> tuple[int, bytes, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=body, headers=headers) as response:
            return response.status, await response.read(), CIMultiDict(response.headers)


def replace_run(monkeypatch: pytest.MonkeyPatch, app: web.Application, run: Any) -> None:
    """The request path's `run` replaced by `run(ctx)` (RequestPath is a frozen dataclass: on the class)."""

    async def replaced(self: RequestPath, ctx: RequestContext) -> Any:
        return await run(ctx)

    monkeypatch.setattr(RequestPath, "run", replaced)


class Chunks:
    """A ChunkSource of fixed chunks; remembers being closed."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = chunks
        self.closed = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    def close(self) -> None:
        self.closed += 1


# -- serve ---------------------------------------------------------------------------------------------------------

async def test_a_gateway_without_its_request_path_answers_503_starting(start_emulator: StartEmulator,
                                                                      start_app: StartApp) -> None:
    url, app = await started(start_emulator, start_app)
    gateway = app[GATEWAY]
    path, gateway.path = gateway.path, None
    try:
        status, body, headers = await post(url, "/v1/chat/completions", CHAT, AUTH)
    finally:
        gateway.path = path
    assert status == 503
    assert body == error_body(Overloaded("the gateway is starting"))
    assert orjson.loads(body)["error"]["message"] == "the gateway is starting"
    assert headers["Content-Type"].startswith("application/json")


async def test_the_context_carries_the_path_session_header_wire_and_wire_key(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """An Anthropic Messages request keyed by x-api-key alone: the wire's key header is read (not only Bearer),
    the context knows its path, wire and session header, and the answer is rendered in the wire's shape."""
    url, app = await started(start_emulator, start_app)
    path, real_run = app[GATEWAY].path, RequestPath.run
    seen: list[RequestContext] = []

    async def run(ctx: RequestContext) -> Any:
        seen.append(ctx)
        return await real_run(path, ctx)

    replace_run(monkeypatch, app, run)
    with capture_logs() as logs:
        status, body, headers = await post(url, "/v1/messages", MESSAGES,
                                           {"x-api-key": TEST_API_KEY, SESSION_HEADER: "conv-7"})
        line = await request_line(logs)
    assert status == 200, body
    (ctx,) = seen
    assert ctx.path == "/v1/messages"
    assert ctx.wire is WIRES["/v1/messages"]
    assert ctx.session_header == "conv-7"
    assert ctx.api_key == TEST_API_KEY
    answer = orjson.loads(body)
    assert answer["type"] == "message" and answer["role"] == "assistant"
    assert answer["usage"]["output_tokens"] == line["completion_tokens"] > 0
    assert headers["Content-Type"].startswith("application/json")
    assert (line["status"], line["outcome"], line["path"]) == (200, "ok", "/v1/messages")


async def test_tracing_starts_from_the_request_headers_and_finishes_with_the_request(
        start_emulator: StartEmulator, start_app: StartApp) -> None:
    url, app = await started(start_emulator, start_app)
    started_with: list[tuple[Any, RequestContext]] = []
    finished: list[RequestContext] = []

    class Tracing:
        def start(self, headers: Any, ctx: RequestContext) -> Any:
            started_with.append((headers, ctx))
            return SimpleNamespace(finish=finished.append, recording=False, headers=dict)  # unsampled, no traceparent

    app[GATEWAY].tracing = Tracing()
    try:
        status, _, _ = await post(url, "/v1/chat/completions", CHAT, {**AUTH, "traceparent": "00-abc-def-01"})
        for _ in range(250):
            if finished:
                break
            await asyncio.sleep(0.02)
    finally:
        app[GATEWAY].tracing = None
    assert status == 200
    ((headers, ctx),) = started_with
    assert headers["traceparent"] == "00-abc-def-01"
    assert isinstance(ctx, RequestContext) and ctx.path == "/v1/chat/completions"
    assert finished == [ctx]


async def test_a_json_reply_is_answered_with_its_status_body_headers_and_json_type(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    url, app = await started(start_emulator, start_app)

    async def run(ctx: RequestContext) -> Any:
        return JsonReply(202, b'{"made":"up"}', {"x-extra": "yes"})

    replace_run(monkeypatch, app, run)
    with capture_logs() as logs:
        status, body, headers = await post(url, "/v1/chat/completions", CHAT, AUTH)
        line = await request_line(logs)
    assert (status, body) == (202, b'{"made":"up"}')
    assert headers["x-extra"] == "yes"
    assert headers["x-request-id"] == line["request_id"]
    assert headers["Content-Type"].startswith("application/json")
    assert line["status"] == 202


async def test_an_error_of_a_wire_is_answered_in_the_wires_shape(start_emulator: StartEmulator,
                                                                 start_app: StartApp) -> None:
    url, _ = await started(start_emulator, start_app)
    with capture_logs() as logs:
        status, body, headers = await post(url, "/v1/messages", MESSAGES, {"x-api-key": "not-a-key"})
        line = await request_line(logs)
    assert status == 401
    error = orjson.loads(body)
    assert error["type"] == "error" and error["error"]["type"] == "authentication_error", error
    assert headers["Content-Type"].startswith("application/json")
    assert (line["status"], line["outcome"]) == (401, "rejected")


@pytest.mark.parametrize(("error", "preset", "status", "outcome", "logged", "retry_after"), [
    (GatewayError("boom", code="my_code"), None, 500, "rejected", "my_code", None),
    (GatewayError("boom"), None, 500, "rejected", "api_error", None),
    (GatewayError("boom", code="my_code"), "said_before", 500, "rejected", "said_before", None),
    (Overloaded("busy", retry_after=3.4), None, 503, "rejected", Overloaded.code or Overloaded.type, "3"),
    (UpstreamError("backend gone"), None, UpstreamError.status, "upstream_error",
     UpstreamError.code or UpstreamError.type, None),
], ids=["code", "type", "an error said before", "retry-after", "upstream"])
async def test_a_gateway_error_sets_the_lines_status_outcome_and_error(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch,
        error: GatewayError, preset: str | None, status: int, outcome: str, logged: str,
        retry_after: str | None) -> None:
    url, app = await started(start_emulator, start_app)

    async def run(ctx: RequestContext) -> Any:
        ctx.result.error = preset
        raise error

    replace_run(monkeypatch, app, run)
    with capture_logs() as logs:
        answered, body, headers = await post(url, "/v1/chat/completions", CHAT, AUTH)
        line = await request_line(logs)
    assert answered == status
    assert body == error_body(error)
    assert headers.get("Retry-After") == retry_after
    assert headers["x-request-id"] == line["request_id"]
    assert (line["status"], line["outcome"], line["error"]) == (status, outcome, logged)


async def test_a_request_cancelled_under_the_path_is_logged_499(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    url, app = await started(start_emulator, start_app)

    async def run(ctx: RequestContext) -> Any:
        raise asyncio.CancelledError

    replace_run(monkeypatch, app, run)
    with capture_logs() as logs:
        with pytest.raises(aiohttp.ClientError):
            await post(url, "/v1/chat/completions", CHAT, AUTH)
        line = await request_line(logs)
    assert (line["status"], line["outcome"]) == (499, "client_disconnected")
    assert not [e for e in logs if e["event"] == "internal_error"]


# -- _stream ---------------------------------------------------------------------------------------------------------

async def streamed(start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch,
                   source: Chunks) -> tuple[int, bytes, CIMultiDict[str], int, dict[str, Any]]:
    """Stream `source`'s chunks through the edge; the status, body, headers, how many chunks went through
    `_write_behind` (the timed write for a client that is behind), and the request line."""
    url, app = await started(start_emulator, start_app)
    behind: list[bytes] = []
    real = http._write_behind

    async def write_behind(response: Any, transport: Any, ctx: Any, chunk: bytes, timeout_s: float) -> bool:
        behind.append(chunk)
        return await real(response, transport, ctx, chunk, timeout_s)

    async def run(ctx: RequestContext) -> Any:
        return StreamReply(source, {"x-stream": "1"})

    replace_run(monkeypatch, app, run)
    monkeypatch.setattr(http, "_write_behind", write_behind)
    with capture_logs() as logs:
        status, body, headers = await post(url, "/v1/chat/completions", {**CHAT, "stream": True}, AUTH)
        line = await request_line(logs)
    return status, body, headers, len(behind), line


async def test_a_stream_is_sent_as_server_sent_events_with_the_replys_headers(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> None:
    source = Chunks(b"data: one\n\n", b"data: two\n\n")
    status, body, headers, behind, line = await streamed(start_emulator, start_app, monkeypatch, source)
    assert (status, body) == (200, b"data: one\n\ndata: two\n\n")
    assert headers["Content-Type"] == "text/event-stream"
    assert headers["Cache-Control"] == "no-cache" and headers["X-Accel-Buffering"] == "no"
    assert headers["x-stream"] == "1" and headers["x-request-id"] == line["request_id"]
    assert line["status"] == 200
    assert behind == 0  # small chunks to a client that keeps up: written directly, no timer each
    assert source.closed == 1


# asyncio's transports pause writing at 64 KiB by default; a chunk under half of it into an empty buffer is
# written directly, one of half or more goes through the timed write
HALF = 64 * 1024 // 2


@pytest.mark.parametrize(("size", "timed"), [(HALF - 1, 0), (HALF, 1), (64 * 1024 // 3 + 100, 0), (HALF + 8000, 1)],
                         ids=["under half", "half", "over a third", "over half"])
async def test_a_large_chunk_gets_the_timed_write_and_a_small_one_not(
        start_emulator: StartEmulator, start_app: StartApp, monkeypatch: pytest.MonkeyPatch,
        size: int, timed: int) -> None:
    chunk = b"x" * size
    status, body, _, behind, _ = await streamed(start_emulator, start_app, monkeypatch, Chunks(chunk))
    assert (status, len(body)) == (200, size)
    assert behind == timed


# -- _write_behind -----------------------------------------------------------------------------------------------------

class Transport:
    def __init__(self) -> None:
        self.aborted = 0

    def get_write_buffer_size(self) -> int:
        return 1234

    def abort(self) -> None:
        self.aborted += 1


class Response:
    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.written: list[bytes] = []

    async def write(self, chunk: bytes) -> None:
        if self.hang:
            await asyncio.Event().wait()
        self.written.append(chunk)


def bare_context() -> Any:
    return SimpleNamespace(request_id="req-1", result=SimpleNamespace(status=200, outcome="ok", error=None))


async def test_a_client_that_takes_nothing_is_dropped_as_499_with_one_warning() -> None:
    transport, ctx = Transport(), bare_context()
    with capture_logs() as logs:
        kept = await http._write_behind(Response(hang=True), transport, ctx, b"chunk", 0.05)
    assert kept is False
    assert (ctx.result.status, ctx.result.outcome, ctx.result.error) == (499, "client_disconnected", "client_write_timeout")
    assert transport.aborted == 1
    assert logs == [{"event": "client_write_timeout", "log_level": "warning", "request_id": "req-1",
                     "timeout_s": 0.05, "buffered_bytes": 1234}]


async def test_a_client_that_catches_up_keeps_its_stream() -> None:
    transport, ctx, response = Transport(), bare_context(), Response(hang=False)
    with capture_logs() as logs:
        kept = await http._write_behind(response, transport, ctx, b"chunk", 5.0)
    assert kept is True
    assert response.written == [b"chunk"]
    assert (ctx.result.status, ctx.result.outcome, ctx.result.error) == (200, "ok", None)
    assert transport.aborted == 0 and logs == []
