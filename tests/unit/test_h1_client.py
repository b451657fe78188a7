"""The upstream hop's HTTP/1.1 client (gateway/backends/h1.py) against scripted servers on loopback: what it
writes, keep-alive reuse, bodies by length, chunks and close, timeouts, broken and malformed answers,
a stale pooled connection, cancellation, and a body larger than the pause mark."""

from __future__ import annotations

import asyncio
import gc

import httptools
import pytest

from gateway.backends.h1 import (HIGH_WATER, ConnectFailed, ReadTimeout, Response, UpstreamClient, UpstreamClosed,
                                 header_lines)
from tests.unit.h1_scripted import JSON, Server, answer, client  # noqa: F401 (a fixture)

pytestmark = pytest.mark.both_loops  # tests/conftest.py: on uvloop, which the gateway serves on, and asyncio's loop


async def test_writes_the_request_and_reuses_the_connection(client: UpstreamClient) -> None:
    server: Server

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            writer.write(answer(b'{"ok":true}', b"X-Seen: 1\r\n"))

    server = Server(handler)
    async with server as url:
        for _ in range(3):
            response = await client.post(url, "/chat/completions", b'{"a":1}', JSON, connect_s=2, read_s=2)
            assert (response.status, response.headers["x-seen"]) == (200, "1")
            assert await response.read() == b'{"ok":true}'
    assert server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Host: " + url.split("//")[1].split("/")[0].encode() in lines
    assert b"Content-Type: application/json" in lines and b"Content-Length: 7" in lines
    assert body == b'{"a":1}'


async def test_streams_chunks_as_they_arrive_then_pools_the_connection(client: UpstreamClient) -> None:
    go = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await go.wait()
            writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    server = Server(handler)
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert await response.readany() == b"first"
        go.set()
        assert await response.readany() == b"second"
        assert await response.readany() == b""
        response.release()
        assert client.idle_count() == 1
        again = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert await again.read() == b"firstsecond"
    assert server.connections == 1


async def test_a_body_ended_by_the_close_is_read_whole_and_not_pooled(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()

    server = Server(handler)
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert await response.read() == b"all of it"
        assert client.idle_count() == 0


async def test_a_stale_pooled_connection_is_replaced_once(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int) -> None:
        await server.request(reader)
        writer.write(answer(b"one"))
        await writer.drain()
        if number == 1:
            await server.request(reader)  # the reused connection's request: closed unanswered (a keep-alive timeout)
            return
        while await server.request(reader):
            writer.write(answer(b"two"))

    server = Server(handler)
    async with server as url:
        assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"one"
        assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"one"
    assert server.connections == 2


async def test_a_replica_that_breaks_off_after_answering_in_part_is_not_retried(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nten bytes.")
        await writer.drain()

    server = Server(handler)
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        with pytest.raises(UpstreamClosed, match="before its response ended"):
            await response.read()
    assert server.connections == 1


async def test_no_head_in_time_is_a_read_timeout(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.request(reader)
        await asyncio.sleep(5)

    server = Server(handler)
    async with server as url:
        started = asyncio.get_running_loop().time()
        with pytest.raises(ReadTimeout):
            await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=0.2)
        assert asyncio.get_running_loop().time() - started < 2
        assert client.idle_count() == 0


async def test_a_gap_in_the_body_longer_than_the_read_timeout_fails_unless_switched_off(
        client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
            await asyncio.sleep(0.4)
            writer.write(b"1\r\nb\r\n0\r\n\r\n")

    server = Server(handler)
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=0.2)
        assert await response.readany() == b"a"
        with pytest.raises(ReadTimeout):
            await response.readany()
        quiet = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=0.2)
        quiet.read_timeout = None  # a watchdog keeps the idle timeout
        assert await quiet.read() == b"ab"


async def test_refused_connection_and_malformed_answer(client: UpstreamClient) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    server = Server(handler)
    async with server as url:
        with pytest.raises(UpstreamClosed, match="malformed"):
            await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
    with pytest.raises(ConnectFailed):
        await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)


async def test_a_cancelled_read_drops_the_connection(client: UpstreamClient) -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await writer.drain()
        await reader.read()  # until the client closes
        closed.set()

    server = Server(handler)
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=5)
        assert await response.readany() == b"a"
        reading = asyncio.ensure_future(response.readany())
        await asyncio.sleep(0.05)
        reading.cancel()
        await asyncio.wait_for(closed.wait(), 2)
        assert client.idle_count() == 0


async def test_bodies_larger_than_the_pause_mark_arrive_whole(client: UpstreamClient) -> None:
    big = bytes(range(256)) * (3 * HIGH_WATER // 256)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            writer.write(answer(big))
            await writer.drain()

    server = Server(handler)
    async with server as url:
        assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == big
        streamed = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        await asyncio.sleep(0.2)  # the reader lags: reading pauses past the mark, and resumes as it reads
        parts = []
        while chunk := await streamed.readany():
            parts.append(chunk)
        assert b"".join(parts) == big
        streamed.release()
    assert server.connections == 1


def test_header_lines_refuse_what_would_split_the_head() -> None:
    assert header_lines({"A": "b", "Traceparent": "00-x"}) == "A: b\r\nTraceparent: 00-x\r\n"
    for bad in ({"X": "a\r\nInjected: 1"}, {"X\n": "a"}, {"X:Y": "a"}):
        with pytest.raises(ValueError):
            header_lines(bad)


async def test_a_finished_response_leaves_no_cycle_for_the_gc(client: UpstreamClient) -> None:
    """The parser holds the response's methods: kept after the end, every request would leave a cycle that
    only a collection frees (it was a fifth of the gateway's GC work)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        while await server.request(reader):
            writer.write(answer(b"{}"))

    server = Server(handler)
    async with server as url:
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                assert await (await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)).read() == b"{}"
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [o for o in gc.garbage if isinstance(o, (Response, httptools.HttpResponseParser))]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert cyclic == []


async def test_connections_idle_too_long_are_closed_not_kept() -> None:
    client = UpstreamClient(idle_s=0.2)
    closed = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        nonlocal closed
        while await server.request(reader):
            writer.write(answer(b"{}"))
        closed += 1

    server = Server(handler)
    async with server as url:
        first, second = await asyncio.gather(*(client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
                                               for _ in range(2)))
        await first.read()
        await asyncio.sleep(0.3)
        await second.read()  # put back after the first has idled past idle_s: the first is closed
        await asyncio.sleep(0.1)
        assert (client.idle_count(), closed) == (1, 1)
    await client.close()
