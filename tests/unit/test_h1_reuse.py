"""Reusing a pooled connection (issue 29): one the replica closed while idle is found closed before a request
goes out on it (a POST sent twice is GPU work done twice), and the re-sends that remain are counted."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from gateway.backends.h1 import UpstreamClient
from tests.unit.h1_scripted import JSON, Server, answer

pytestmark = pytest.mark.both_loops


class ClosingServer:
    """A blocking server in its own thread: answers one request per connection (keep-alive, as far as the
    client can tell) and then closes it, outside the client's event loop."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.requests_per_connection: list[int] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data or not data.endswith(b"{}"):
                    data += conn.recv(65536)
                conn.sendall(answer(b"{}"))
                conn.shutdown(socket.SHUT_WR)
                conn.settimeout(0.5)
                extra = b""
                try:
                    while chunk := conn.recv(65536):
                        extra += chunk
                except OSError:
                    pass
                self.requests_per_connection.append(1 + extra.count(b"POST "))
                self.closed.set()


@pytest.fixture
def closing_server() -> Iterator[ClosingServer]:
    server = ClosingServer()
    server.thread.start()
    yield server
    server.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (a close alone does not, on Linux)
    server.listener.close()
    server.thread.join(5)
    assert not server.thread.is_alive()


async def test_a_pooled_connection_closed_by_the_replica_is_not_sent_a_request(
        closing_server: ClosingServer) -> None:
    resent: list[None] = []
    client = UpstreamClient(on_resend=lambda: resent.append(None))
    try:
        for _ in range(3):
            closing_server.closed.clear()
            assert await (await client.post(closing_server.url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"{}"
            assert closing_server.closed.wait(5)
            time.sleep(0.05)  # the close has reached this host, and the event loop has not run since: unread
            assert client.idle_count() == 1
    finally:
        await client.close()
    await asyncio.sleep(0.6)
    assert (client.resends, resent) == (0, [])
    assert closing_server.requests_per_connection == [1, 1, 1]


async def test_a_request_the_replica_drops_unanswered_on_a_reused_connection_is_sent_again_and_counted() -> None:
    resent: list[None] = []
    client = UpstreamClient(on_resend=lambda: resent.append(None))

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await server.request(reader)
        writer.write(answer(b"one"))
        await writer.drain()
        if number == 1:
            await server.request(reader)  # read, then closed unanswered: the replica may have started on it
            return
        while await server.request(reader):
            writer.write(answer(b"two"))

    server = Server(handler)
    try:
        async with server as url:
            assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"one"
            assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"one"
    finally:
        await client.close()
    assert (client.resends, len(resent), len(server.requests)) == (1, 1, 3)
