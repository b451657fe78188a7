"""`WholeResponse` puts on the wire the bytes aiohttp's `web.Response` puts there for the same body, status and
headers (the Date header's value aside): over HTTP/1.1 and 1.0, kept alive or closed, a HEAD request, statuses
with and without a body; and a connection kept alive after it serves the next request."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.edge.whole import WholeResponse

BODY = b'{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"hi \\u00e9"}}]}'
HEADERS = {"x-request-id": "r-1", "x-gateway-tier": "small"}
DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")


def _answer(whole: bool) -> web.Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        status = int(request.query.get("status", "200"))
        body = b"" if request.query.get("empty") else BODY
        if whole:
            return WholeResponse(body, status, HEADERS)
        return web.Response(body=body, status=status, headers=HEADERS, content_type="application/json")
    return handler


@pytest.fixture
async def port() -> AsyncIterator[int]:
    app = web.Application()
    for name, whole in (("old", False), ("new", True)):
        app.router.add_post(f"/{name}", _answer(whole))
        app.router.add_get(f"/{name}", _answer(whole))  # (and HEAD)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    yield server.sockets[0].getsockname()[1]
    await runner.cleanup()


async def _exchange(port: int, requests: list[bytes]) -> bytes:
    """Send the requests one after another on one connection; every byte the server sends until it closes or
    goes quiet."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for request in requests:
        writer.write(request)
    await writer.drain()
    received = b""
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), 0.5)
        except TimeoutError:
            break
        if not chunk:
            break
        received += chunk
    writer.close()
    return DATE.sub(b"\r\nDate: -\r\n", received)


def _request(method: str, path: str, version: str, connection: str | None) -> bytes:
    head = f"{method} {path} HTTP/{version}\r\nHost: 127.0.0.1\r\n" + ("Content-Length: 2\r\n" if method == "POST" else "")
    if connection is not None:
        head += f"Connection: {connection}\r\n"
    return head.encode() + b"\r\n" + (b"{}" if method == "POST" else b"")


CASES = [
    ("POST", "?status=200", "1.1", None),
    ("POST", "?status=400", "1.1", None),
    ("POST", "?status=429", "1.1", "keep-alive"),
    ("POST", "?status=503", "1.1", "close"),
    ("POST", "?status=200", "1.0", None),
    ("POST", "?status=200", "1.0", "keep-alive"),
    ("POST", "?status=200&empty=1", "1.1", None),
    ("POST", "?status=204", "1.1", None),
    ("HEAD", "?status=200", "1.1", None),
    ("GET", "?status=200", "1.1", None),
]


@pytest.mark.parametrize(("method", "query", "version", "connection"), CASES)
async def test_the_same_bytes_as_aiohttp_s_response(port: int, method: str, query: str, version: str,
                                                      connection: str | None) -> None:
    kept = connection == "keep-alive" or (version == "1.1" and connection is None)  # then a second request
    sent = {name: await _exchange(port, [_request(method, f"/{name}{query}", version, connection)] * (1 + kept))
            for name in ("old", "new")}
    assert sent["new"] == sent["old"]
    assert sent["new"].startswith(f"HTTP/{version} ".encode()) and sent["new"].count(b"HTTP/") == 1 + kept
    if method == "POST" and "empty" not in query and "204" not in query:
        assert BODY in sent["new"] and f"Content-Length: {len(BODY)}".encode() in sent["new"]


async def test_a_kept_alive_connection_serves_the_next_request(port: int) -> None:
    sent = await _exchange(port, [_request("POST", "/new?status=200", "1.1", None)] * 3)
    assert sent.count(b"HTTP/1.1 200 OK\r\n") == 3 and sent.count(BODY) == 3
