"""The upstream client's DNS cache (issue 29): a replica's name looked up once per TTL (aiohttp's client's
10 s), each of its addresses tried in turn, looked up again once none answered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.backends.h1 import UpstreamClient
from gateway.backends.resolver import DnsCache
from tests.unit.h1_scripted import JSON, answer

pytestmark = pytest.mark.both_loops


async def test_names_are_looked_up_once_per_ttl() -> None:
    lookups: list[str] = []

    async def lookup(host: str, port: int) -> list[tuple[Any, ...]]:
        lookups.append(host)
        return [(2, 1, 6, "", ("10.0.0.7", port)), (2, 1, 6, "", ("10.0.0.7", port)), (10, 1, 6, "", ("fd00::7", port))]

    cache = DnsCache(ttl_s=0.2, lookup=lookup)
    assert await cache.resolve("vllm.internal", 80) == [(2, "10.0.0.7"), (10, "fd00::7")]
    assert await cache.resolve("vllm.internal", 80) == [(2, "10.0.0.7"), (10, "fd00::7")]
    assert await cache.resolve("127.0.0.1", 80) == [(2, "127.0.0.1")]  # a literal: no lookup
    assert lookups == ["vllm.internal"]
    await asyncio.sleep(0.25)
    await cache.resolve("vllm.internal", 80)
    cache.forget("vllm.internal", 80)
    await cache.resolve("vllm.internal", 80)
    assert lookups == ["vllm.internal"] * 3


async def test_the_client_resolves_through_its_cache_and_tries_each_address() -> None:
    lookups: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(answer(b"{}", b"Connection: close\r\n"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def lookup(host: str, port: int) -> list[tuple[Any, ...]]:
        lookups.append(host)  # an address nothing listens on first, then the server
        return [(2, 1, 6, "", ("127.0.0.2", port)), (2, 1, 6, "", ("127.0.0.1", port))]

    client = UpstreamClient(dns=DnsCache(lookup=lookup))
    try:
        for _ in range(3):
            response = await client.post(f"http://replica.test:{port}/v1", "/x", b"{}", JSON, connect_s=2, read_s=2)
            assert await response.read() == b"{}"
    finally:
        await client.close()
        server.close()
    assert lookups == ["replica.test"]
