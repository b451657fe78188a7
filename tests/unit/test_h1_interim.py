"""Interim responses (1xx, RFC 9110 §15.2): the client reads and discards them, the caller gets the final
response, and the connection goes back to the pool only once that response was read whole (issue 29: a
103 taken as final handed the first request's JSON to the next request on the pooled connection)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.backends.h1 import UpstreamClient, UpstreamClosed
from tests.unit.h1_scripted import JSON, Server, answer, client, replying  # noqa: F401 (a fixture)

pytestmark = pytest.mark.both_loops

EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


async def test_103_then_the_200_later_gives_the_200_and_the_next_request_its_own_answer(
        client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        number = 0
        while await server.request(reader):
            number += 1
            writer.write(EARLY_HINTS)
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(answer(b'{"answer":%d}' % number, b"X-Final: yes\r\n"))

    server = Server(handler)
    async with server as url:
        first = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert (first.status, first.headers.get("x-final"), first.headers.get("link")) == (200, "yes", None)
        assert await first.read() == b'{"answer":1}'
        second = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert second.status == 200
        assert await second.read() == b'{"answer":2}'
    assert server.connections == 1


async def test_100_and_200_in_one_write_give_the_200_with_its_own_headers(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        number = 0
        while await server.request(reader):
            number += 1
            writer.write(CONTINUE + answer(b"body %d" % number, b"X-Final: yes\r\n"))

    server = Server(handler)
    async with server as url:
        for number in (1, 2, 3):
            response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
            assert (response.status, response.headers["x-final"]) == (200, "yes")
            assert await response.read() == b"body %d" % number
    assert server.connections == 1


async def test_interim_responses_split_byte_by_byte_then_a_streamed_answer(client: UpstreamClient) -> None:
    """Several interim heads (any 1xx but 101, one with no reason phrase), each byte in its own write."""
    script = (CONTINUE + b"HTTP/1.1 102 Processing\r\n\r\n" + EARLY_HINTS + b"HTTP/1.1 199\r\nX-Odd: 1\r\n\r\n"
              + b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            for i in range(len(script)):
                writer.write(script[i:i + 1])
                await writer.drain()
                if i % 16 == 0:
                    await asyncio.sleep(0)

    server = Server(handler)
    async with server as url:
        for _ in range(2):
            response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
            assert response.status == 200 and "x-odd" not in response.headers
            assert await response.read() == b"abc"
    assert server.connections == 1


async def test_a_101_nobody_asked_for_fails_the_attempt(client: UpstreamClient) -> None:
    async with replying(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n" + answer(b"{}")) as url:
        with pytest.raises(UpstreamClosed, match="101"):
            await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert client.idle_count() == 0


async def test_bytes_after_the_response_in_the_same_read_keep_the_answer_but_not_the_connection(
        client: UpstreamClient) -> None:
    server = replying(answer(b"mine") + answer(b"nobody's"))
    async with server as url:
        for _ in range(2):
            response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
            assert await response.read() == b"mine"
            assert client.idle_count() == 0
    assert server.connections == 2
