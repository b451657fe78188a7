"""The upstream attempt has one owner of the replica's lease and of the upstream response until the relay
takes both (issue 29): an exception after the first byte and before the relay exists releases the lease once
and closes the upstream connection (the replica sees the cancel), instead of leaking both."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.app import create_app
from gateway.state import GATEWAY
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp

FIRST_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


class Injected(RuntimeError):
    """The fault the test puts between the first byte and the relay."""


def raising(*args: Any, **kwargs: Any) -> Any:
    raise Injected("between the first byte and the relay")


@pytest.mark.parametrize("where", ["ContextSink", "SseRelay"])
async def test_a_failure_before_the_relay_exists_releases_the_lease_and_closes_the_upstream(
        start_app: StartApp, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    upstream_closed = asyncio.Event()

    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"%x\r\n%s\r\n" % (len(FIRST_EVENT), FIRST_EVENT))
            await writer.drain()
            while await reader.read(65536):  # the request's body, then nothing until the gateway lets go
                pass
            upstream_closed.set()
        except ConnectionError:
            upstream_closed.set()
        finally:
            writer.close()

    server = await asyncio.start_server(replica, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(f"gateway.upstream.hop.{where}", raising)
    app = create_app(gateway_config([tier("t", [f"http://127.0.0.1:{port}/v1"])]))
    try:
        url = await start_app(app)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {TEST_API_KEY}"},
                                    json={"model": "t", "stream": True,
                                          "messages": [{"role": "user", "content": "hello"}]}) as response:
                assert response.status == 500
                assert (await response.json())["error"]["type"] == "api_error"
        await asyncio.wait_for(upstream_closed.wait(), 3)
        assert app[GATEWAY].pool.states()["t-0"].in_flight == 0
    finally:
        server.close()
