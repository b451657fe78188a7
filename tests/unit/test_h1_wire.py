"""What the upstream client writes and what it accepts, against the RFCs (issue 29): the replica URL's query
string, request targets and header values HTTP/1.1 cannot carry, response head limits (aiohttp's client's),
folded header lines, and a connection paused by flow control never pooled paused."""

from __future__ import annotations

import asyncio

import pytest

from gateway.backends.h1 import (HIGH_WATER, MAX_FIELD, MAX_HEADERS, MAX_LINE, UpstreamClient, UpstreamClosed,
                                 header_lines)
from gateway.backends.upstream import Retry, post
from gateway.config import Replica
from gateway.config.routes import Upstream
from tests.unit.h1_scripted import JSON, Server, answer, client, replying  # noqa: F401 (a fixture)

pytestmark = pytest.mark.both_loops


async def test_the_query_of_the_replica_url_goes_out(client: UpstreamClient) -> None:
    server = replying(answer(b"{}"))
    async with server as url:
        base = url.replace("/v1", "/openai/deployments/gpt?api-version=2024-10-21")
        assert await (await client.post(base, "/chat/completions", b"{}", JSON, connect_s=2, read_s=2)).read() == b"{}"
    assert server.requests[0].startswith(
        b"POST /openai/deployments/gpt/chat/completions?api-version=2024-10-21 HTTP/1.1\r\n")


async def test_a_path_or_url_with_cr_lf_space_or_non_ascii_is_refused_before_sending(
        client: UpstreamClient) -> None:
    server = replying(answer(b"{}"))
    async with server as url:
        for path in ("/x\r\nInjected: 1", "/x y", "/caf\u00e9"):
            with pytest.raises(ValueError, match="printable ASCII"):
                await client.post(url, path, b"{}", JSON, connect_s=2, read_s=2)
        with pytest.raises(ValueError, match="printable ASCII"):
            await client.post(url + "/a%0d%0a\r\nX: 1", "/x", b"{}", JSON, connect_s=2, read_s=2)
    assert server.requests == []


def test_header_values_outside_latin_1_and_control_characters_are_refused_naming_the_header() -> None:
    assert header_lines({"Tracestate": "a=b,c=d\t", "X-Obs": "caf\u00e9"}) == "Tracestate: a=b,c=d\t\r\nX-Obs: caf\u00e9\r\n"
    for bad in ({"Authorization": "Bearer \u20ac"}, {"X": "a\rb"}, {"X": "a\x00"}, {"X": "\x7f"}):
        with pytest.raises(ValueError, match="X|Authorization"):
            header_lines(bad)
    for name in ("X Y", "X:", "", "\u00e9"):
        with pytest.raises(ValueError, match="token"):
            header_lines({name: "v"})


async def test_a_header_http_cannot_carry_fails_over_with_a_clear_error(client: UpstreamClient) -> None:
    server = replying(answer(b"{}"))
    async with server as url:
        replica = Replica(name="r1", url=url, model="m")
        with pytest.raises(Retry) as failed:
            await post(client, replica, "/chat/completions", b"{}", Upstream(), {"tracestate": "k=\u20ac"})
    assert failed.value.error.status == 502
    assert "backend r1" in failed.value.error.message and "'tracestate'" in failed.value.error.message
    assert server.requests == []


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * MAX_FIELD + b"\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 " + b"O" * MAX_LINE + b"\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1)) + b"Content-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Endless: " + b"a" * (2 * 1024 * 1024),  # 2 MiB and no end of the head
], ids=["field", "status-line", "count", "2MiB-unended"])
async def test_response_heads_past_aiohttps_limits_are_refused(client: UpstreamClient, head: bytes) -> None:
    server = replying(head)
    async with server as url:
        with pytest.raises(UpstreamClosed, match="malformed"):
            await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
    assert client.idle_count() == 0


async def test_heads_at_the_limits_are_accepted(client: UpstreamClient) -> None:
    field = b"X-Big: " + b"a" * (MAX_FIELD - len(b"X-Big")) + b"\r\n"
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS - 2))
    server = replying(b"HTTP/1.1 200 OK\r\n" + field + many + b"Content-Length: 2\r\n\r\nok")
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert (len(response.headers["x-big"]), await response.read()) == (MAX_FIELD - len(b"X-Big"), b"ok")


async def test_folded_header_lines_are_unfolded_into_a_space(client: UpstreamClient) -> None:
    server = replying(b"HTTP/1.1 200 OK\r\nX-Folded: one\r\n two\r\n\t three\r\nContent-Length: 2\r\n\r\nok")
    async with server as url:
        for _ in range(2):
            response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
            assert response.headers["x-folded"] == "one two three"
            assert await response.read() == b"ok"
    assert server.connections == 1


async def test_a_connection_paused_by_flow_control_is_not_pooled_paused(client: UpstreamClient) -> None:
    """The whole body arrives while nobody reads it (reading pauses past the mark), then the response is
    released unread: the next request on the pooled connection must get its answer, not a read timeout."""
    big = b"x" * (HIGH_WATER + 1)  # the read that crosses the mark holds the body's last byte

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int) -> None:
        number = 0
        while await server.request(reader):
            number += 1
            writer.write(answer(big) if number == 1 else answer(b"small"))
            await writer.drain()

    server = Server(handler)
    async with server as url:
        unread = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        for _ in range(100):  # until the body ended whole, reading paused past the mark
            await asyncio.sleep(0.02)
            if unread._complete:
                break
        assert unread._complete and unread._paused
        unread.release()
        assert client.idle_count() == 1
        again = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=1)
        assert await again.read() == b"small"
    assert server.connections == 1


async def test_trailers_of_a_chunked_body_do_not_replace_its_headers(client: UpstreamClient) -> None:
    """Found by the differential test: llhttp reports trailer fields like headers, after the body."""
    server = replying(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                          b"2;ext=1\r\nok\r\n0\r\nContent-Type: text/html\r\nX-Checksum: 1\r\n\r\n")
    async with server as url:
        response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
        assert await response.read() == b"ok"
        assert response.headers["content-type"] == "text/event-stream" and "x-checksum" not in response.headers
