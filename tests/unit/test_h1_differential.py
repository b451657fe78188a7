"""Differential test of the upstream client (issue 29): the same scripted replica responses, read through h1.py
and through aiohttp's client, give the same status, headers, body bytes and connection reuse.

Hypothesis draws sequences of responses (interim 1xx before the final one, 204/304, bodies by length, by
chunks with extensions and trailers, or by the connection's close, `Connection: close`) and the splits of the
bytes on the wire (each piece written on its own, the loop turning between pieces). Both clients send the same
requests one after another to a fresh scripted server; the server records which connection served each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import pytest
import uvloop
from hypothesis import HealthCheck, given, settings, strategies as st

from gateway.backends.h1 import UpstreamClient
from tests.unit.h1_scripted import JSON

INTERIM = (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n",
           b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
REASONS = {200: b"OK", 201: b"Created", 204: b"No Content", 304: b"Not Modified", 404: b"Not Found",
           500: b"Internal Server Error", 503: b"Service Unavailable"}

names = st.from_regex(r"X-[A-Za-z0-9][A-Za-z0-9-]{0,8}", fullmatch=True)
values = st.from_regex(r"[!-~]([ !-~]{0,16}[!-~])?", fullmatch=True)


@dataclass(frozen=True)
class Scripted:
    """One response: its bytes, split into the pieces the server writes, and whether the server then closes."""

    pieces: tuple[bytes, ...]
    closes: bool


@st.composite
def responses(draw: st.DrawFn) -> Scripted:
    status = draw(st.sampled_from(sorted(REASONS)))
    bodiless = status in (204, 304)
    framing = "none" if bodiless else draw(st.sampled_from(["length", "chunked", "eof"]))
    body = b"" if bodiless else draw(st.binary(max_size=400))
    close = framing == "eof" or draw(st.booleans())
    head = [b"HTTP/1.1 %d %s" % (status, REASONS[status])]
    head += [b"%s: %s" % (n.encode(), v.encode()) for n, v in draw(st.lists(st.tuples(names, values), max_size=3))]
    if close and (framing != "eof" or draw(st.booleans())):  # a close the response announces (a silent close
        head.append(b"Connection: close")  # of a kept-alive connection is a race: h1 polls for it, aiohttp fails)
    if framing == "length":
        head.append(b"Content-Length: %d" % len(body))
        wire = body
    elif framing == "chunked":
        head.append(b"Transfer-Encoding: chunked")
        wire = draw(chunked(body))
    else:
        wire = body
    message = b"".join(draw(st.lists(st.sampled_from(INTERIM), max_size=2))) + b"\r\n".join(head) + b"\r\n\r\n" + wire
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(message) - 1)), max_size=6)))
    pieces = tuple(message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)]) if message[a:b])
    return Scripted(pieces, close)


@st.composite
def chunked(draw: st.DrawFn, body: bytes) -> bytes:
    out, rest = [], body
    while rest:
        size = draw(st.integers(1, max(1, len(rest))))
        extension = draw(st.sampled_from([b"", b";ext=1", b';name="quoted"']))
        hex_size = (b"%x" if draw(st.booleans()) else b"%X") % size
        out.append(hex_size + extension + b"\r\n" + rest[:size] + b"\r\n")
        rest = rest[size:]
    trailers = draw(st.lists(st.tuples(names, values), max_size=2))
    out.append(b"0\r\n" + b"".join(b"%s: %s\r\n" % (n.encode(), v.encode()) for n, v in trailers) + b"\r\n")
    return b"".join(out)


class ScriptServer:
    """Answers the n-th request with the n-th scripted response, on whatever connection it came; records the
    connection that served each request."""

    def __init__(self, script: list[Scripted]) -> None:
        self.script = script
        self.served: list[int] = []
        self.connections = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while len(self.served) < len(self.script):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                scripted = self.script[len(self.served)]
                self.served.append(number)
                for piece in scripted.pieces:
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0)
                if scripted.closes:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Outcome = tuple[int, dict[str, str], bytes]


async def through_h1(url: str, count: int) -> list[Outcome]:
    client = UpstreamClient()
    outcomes = []
    try:
        for _ in range(count):
            response = await client.post(url, "/x", b"{}", JSON, connect_s=2, read_s=2)
            outcomes.append((response.status, dict(response.headers), await response.read()))
    finally:
        await client.close()
    return outcomes


async def through_aiohttp(url: str, count: int) -> list[Outcome]:
    outcomes = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        for _ in range(count):
            async with session.post(f"{url}/x", data=b"{}", headers={"Content-Type": "application/json"}) as response:
                body = await response.read()
                outcomes.append((response.status, {k.lower(): v for k, v in response.headers.items()}, body))
    return outcomes


async def run(script: list[Scripted], read: Callable[[str, int], object]) -> tuple[list[Outcome], list[int]]:
    server = ScriptServer(script)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/v1"
        outcomes = await asyncio.wait_for(read(url, len(script)), 10)  # type: ignore[arg-type]
    finally:
        listener.close()
    return outcomes, server.served


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=st.lists(responses(), min_size=1, max_size=4))
def test_h1_reads_what_aiohttp_reads(loop_factory: Callable[[], asyncio.AbstractEventLoop],
                                     script: list[Scripted]) -> None:
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        ours = runner.run(run(script, through_h1))
        theirs = runner.run(run(script, through_aiohttp))
    for (status, headers, body), (their_status, their_headers, their_body) in zip(ours[0], theirs[0], strict=True):
        assert (status, body) == (their_status, their_body)
        assert headers == their_headers
    assert ours[1] == theirs[1]  # the same connection served each request: reuse, or not, alike
