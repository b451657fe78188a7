"""The upstream hop's HTTP/1.1 client: keep-alive connections to the replicas, each request written in
one go, each response parsed by llhttp (httptools) into a body buffer the proxy reads.

aiohttp's client cost a fifth of the gateway's CPU per request (URL objects, cookie jar, header
multidicts, trace hooks, payload writers, a timer re-armed on every read). The hop to a replica needs
none of that: a POST of JSON with the replica's own key, a JSON or SSE answer back.

    client = UpstreamClient()
    response = await client.post(replica.url, "/chat/completions", body, headers, connect_s=5, read_s=60)
    data = await response.read()      # the whole body; the connection goes back to the pool
    chunk = await response.readany()  # or as it arrives (b"" at the end), then release() or close()

Timeouts work as aiohttp's `sock_connect` / `sock_read`: the connection within `connect_s`, then each
read (the head, then every gap in the body) within `read_s` until `read_timeout` is set to None (the
relay's watchdog takes over). A pooled connection is polled before reuse (an end the event loop has not
read yet: the replica closed it while idle); one that still turns out closed before a byte came back is
replaced by a new one once, as browsers do, and counted (`resends`, `on_resend`). Errors are
`ClientFailure`s: `ConnectFailed`, `ConnectTimeout` and `ReadTimeout` (both also `TimeoutError`),
`UpstreamClosed`; a path or header HTTP/1.1 cannot carry is a `ValueError` before anything is sent.

Against RFC 9110/9112: interim responses (1xx but 101) are read and dropped, the caller gets the final one;
folded header lines are unfolded; response heads are limited as aiohttp's client limits them; trailers are
not headers; a connection goes back to the pool only once its response was read whole, reading resumed.
Names resolve through a `DnsCache` (10 s); an https:// replica may bring its own `ssl.SSLContext`.
"""

from __future__ import annotations

import asyncio
import re
import select
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from gateway.backends.resolver import DnsCache
from gateway.backends.urls import redact_url

HIGH_WATER = 256 * 1024  # buffered body bytes at which reading from the replica pauses (a slow client)
IDLE_S = 15.0  # a pooled connection idle this long is closed (when taken, or when another is put back)
ACCEPTED_SCHEMES = ("http", "https")
# response heads: aiohttp's client limits (max_line_size, max_field_size: name and value, max_headers)
MAX_LINE = 8190
MAX_FIELD = 8190
MAX_HEADERS = 128
MAX_HEAD = MAX_LINE + 2 + MAX_HEADERS * (MAX_FIELD + 4) + 2  # what those allow (each interim head too)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 §5.6.2)
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")  # a header value: no CR, LF, NUL, DEL, nothing past Latin-1
_OBS_FOLD = re.compile(rb"\r\n[ \t]+")  # a folded header line (obs-fold): one space instead (RFC 9112 §5.2)


OriginKey = tuple[str, str, int, ssl.SSLContext | None]  # scheme, host, port, TLS context: a pool of connections


class ClientFailure(Exception):
    """The hop to the replica failed: no connection, a timeout, a reset, or a malformed response."""


class ConnectFailed(ClientFailure):
    """The replica refused the connection or could not be reached."""


class ConnectTimeout(ClientFailure, TimeoutError):
    """No connection within `connect_s`."""


class ReadTimeout(ClientFailure, TimeoutError):
    """Connected, but the replica sent nothing within `read_s`."""


class UpstreamClosed(ClientFailure):
    """The connection closed or broke before the response ended, or the response was malformed."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a replica's base URL points: the pool key, the Host header and the path prefix."""

    key: OriginKey
    host: str
    port: int
    host_header: str
    path: str
    query: str  # "?api-version=..." of the base URL (Azure OpenAI-style endpoints need it), or ""
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, url: str, tls: ssl.SSLContext | None = None) -> Origin:
        """`tls`: the replica's own trust and identity for an https:// URL (None: the system's CAs)."""
        parts = urlsplit(url)
        if parts.scheme not in ACCEPTED_SCHEMES or not parts.hostname:
            raise ValueError(f"an upstream URL must be http:// or https:// with a host: {redact_url(url)!r}")
        tls = (tls or ssl.create_default_context()) if parts.scheme == "https" else None
        port = parts.port or (443 if tls else 80)
        host_header = parts.netloc.rpartition("@")[2]
        path, query = parts.path.rstrip("/"), f"?{parts.query}" if parts.query else ""
        if not _is_target(host_header + path + query):
            raise ValueError(f"an upstream URL must be printable ASCII without spaces: {redact_url(url)!r}")
        return cls((parts.scheme, parts.hostname, port, tls), parts.hostname, port, host_header, path, query, tls)


class UpstreamClient:
    """Pooled keep-alive connections per replica origin (no limit on their number, as before)."""

    def __init__(self, idle_s: float = IDLE_S, on_resend: Callable[[], None] | None = None,
                 dns: DnsCache | None = None) -> None:
        self.idle_s = idle_s
        self.dns = dns or DnsCache()
        self.resends = 0  # requests sent again on a new connection (the replica may have received them twice)
        self._on_resend = on_resend  # told of each (a Prometheus counter)
        self._origins: dict[tuple[str, ssl.SSLContext | None], Origin] = {}
        self._paths: set[str] = set()
        self._idle: dict[OriginKey, deque[Connection]] = {}  # most recently used last
        self._closed = False

    def post(self, base_url: str, path: str, body: bytes, headers: str, *, connect_s: float,
             read_s: float | None, tls: ssl.SSLContext | None = None) -> Coroutine[Any, Any, Response]:
        """POST `body` to `base_url + path` with `headers` (complete `Name: value\\r\\n` lines, see
        `header_lines`); the response once its head has arrived, whatever its status. `tls`: the replica's
        own TLS context for an https:// URL (a CA bundle, a client certificate; None: the system's CAs)."""
        origin = self._origins.get((base_url, tls))
        if origin is None:
            origin = self._origin(base_url, tls)
        if path not in self._paths:  # a handful of fixed paths: each checked once
            if not _is_target(path):
                raise ValueError(f"a request path must be printable ASCII without spaces: {path!r}")
            self._paths.add(path)
        head = (f"POST {origin.path}{path}{origin.query} HTTP/1.1\r\nHost: {origin.host_header}\r\n{headers}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")  # `header_lines` checked them
        return self._exchange(origin, head, body, connect_s, read_s)  # its coroutine: no frame around it

    async def get(self, base_url: str, path: str, headers: str, *, connect_s: float, read_s: float | None,
                  tls: ssl.SSLContext | None = None) -> Response:
        """GET `base_url + path` (a health probe, a /metrics scrape) over the same pooled connections, TLS
        and name cache as the replica's requests; the response once its head has arrived, whatever its status."""
        origin = self._origin(base_url, tls)
        if not _is_target(path):
            raise ValueError(f"a request path must be printable ASCII without spaces: {path!r}")
        head = (f"GET {origin.path}{path}{origin.query} HTTP/1.1\r\nHost: {origin.host_header}\r\n{headers}"
                "\r\n").encode("latin-1")
        return await self._exchange(origin, head, b"", connect_s, read_s)

    def _origin(self, base_url: str, tls: ssl.SSLContext | None) -> Origin:
        """The origin of `base_url` under `tls`, made once. A replica's context is one object per TLS settings'
        value (`config.routes.ReplicaTls.context`): a reload that loads the same settings finds the same pool."""
        origin = self._origins.get((base_url, tls))
        if origin is None:
            origin = self._origins[(base_url, tls)] = Origin.of(base_url, tls)
        return origin

    async def _exchange(self, origin: Origin, head: bytes, body: bytes, connect_s: float,
                        read_s: float | None) -> Response:
        """Send the request on an idle connection to the origin when one is left, else on a new one."""
        connection = self._take(origin.key)
        if connection is not None:
            response = Response(connection, read_s)
            connection.send(head, body, response)
            try:
                await response.head()
                return response
            except UpstreamClosed:
                if response.got_bytes:
                    raise
                # the replica closed this idle connection as we reused it (after `_take` found it open): once
                # more on a new one, as browsers do; the replica may have received it, so it is counted
                self.resends += 1
                if self._on_resend is not None:
                    self._on_resend()
        connection = await self._connect(origin, connect_s)
        response = Response(connection, read_s)
        connection.send(head, body, response)
        await response.head()
        return response

    async def _connect(self, origin: Origin, connect_s: float) -> Connection:
        """A new connection: the name resolved (`DnsCache`), its addresses tried in order, all within `connect_s`."""
        try:
            return await asyncio.wait_for(self._open(origin), connect_s)
        except TimeoutError:
            raise ConnectTimeout(f"no connection to {origin.host}:{origin.port} in {connect_s:g} s") from None
        except OSError as err:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {err.strerror or err}") from None

    async def _open(self, origin: Origin) -> Connection:
        loop = asyncio.get_running_loop()
        failure: OSError = OSError("no address")
        for family, address in await self.dns.resolve(origin.host, origin.port):
            try:
                _, connection = await loop.create_connection(
                    lambda: Connection(self, origin.key, loop), address, origin.port, family=family, ssl=origin.tls,
                    server_hostname=origin.host if origin.tls else None)
                return connection
            except OSError as err:  # refused, unreachable, or TLS refused: the next address
                failure = err
        self.dns.forget(origin.host, origin.port)
        raise failure

    def _take(self, key: OriginKey) -> Connection | None:
        """The most recently used idle connection to `key` that is still open, fresh, and has neither an end
        nor stray bytes waiting (`Connection.quiet`: a close the event loop has not read yet)."""
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < self.idle_s and connection.quiet():
                return connection
            connection.abort()
        return None

    def put(self, connection: Connection) -> None:
        """Back to the pool: its response ended whole and the replica keeps the connection alive."""
        if self._closed or connection.closed:
            connection.abort()
            return
        connection.idle_since = now = time.monotonic()
        idle = self._idle.get(connection.key)
        if idle is None:
            idle = self._idle[connection.key] = deque()
        idle.append(connection)
        while idle and now - idle[0].idle_since >= self.idle_s:  # the least recently used, idle too long
            idle.popleft().abort()

    def forget(self, connection: Connection) -> None:
        """An idle connection the replica closed."""
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)

    def idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.abort()
        self._idle.clear()


def _is_interim(head: bytes) -> bool:
    """`HTTP/1.x 1xx ...`: an interim response (its head is all of it: RFC 9112 §6.3)."""
    return (len(head) > 12 and head[9] == 0x31 and head.startswith(b"HTTP/1.") and head[10:12].isdigit()
            and head[12] in b" \r")


def _oversized(head: bytes) -> str | None:
    """Why a head that may hold a field over MAX_FIELD (name and value) or more than MAX_HEADERS fields is
    refused; None when it holds neither (checked only for heads that could)."""
    lines = head.split(b"\r\n")[1:-2]
    if len(lines) > MAX_HEADERS:
        return f"more than {MAX_HEADERS} header fields"
    for line in lines:
        name, _, value = line.partition(b":")
        if len(name) + len(value.strip(b" \t")) > MAX_FIELD:
            return f"a header field over {MAX_FIELD} bytes ({name[:40]!r}...)"
    return None


def _is_target(text: str) -> bool:
    """Printable ASCII without spaces: what a request target (and a Host) may hold (RFC 9112 §3.2)."""
    return text.isascii() and text.isprintable() and " " not in text


def header_lines(headers: dict[str, str]) -> str:
    """`Name: value\\r\\n` lines for `UpstreamClient.post`. Refused (ValueError naming the header): a name
    that is not a token, a value with a control character (CR, LF, NUL: it would split the head) or with a
    character outside Latin-1, which no HTTP/1.1 field value can carry (RFC 9110 §5.5: visible ASCII, and
    octets 0x80-0xFF as opaque obs-text); such values are refused rather than re-encoded."""
    lines = []
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {name!r} is not an HTTP token")
        if not _FIELD_VALUE.fullmatch(value):
            raise ValueError(f"header {name!r} has a character HTTP/1.1 does not allow in a value "
                             "(a control character, or one outside Latin-1)")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


class Connection(asyncio.Protocol):
    """One keep-alive connection: it feeds the bytes it reads to its current response."""

    def __init__(self, client: UpstreamClient, key: OriginKey, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.key = key
        self.loop = loop  # asking asyncio for it costs a getpid() call on Python 3.11
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.closed = False
        self.idle_since = 0.0
        self._poll: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without subclassing it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._poll = select.poll()  # holds no kernel resource: the fd is polled on demand (`quiet`)
            self._poll.register(sock.fileno(), select.POLLIN)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def quiet(self) -> bool:
        """Nothing waits to be read on this idle connection: neither its end (the replica closed it, and the
        event loop has not read that yet) nor stray bytes (a 408, a TLS alert): one poll of the socket."""
        return self._poll is None or not self._poll.poll(0)

    def send(self, head: bytes, body: bytes, response: Response) -> None:
        assert self.transport is not None
        self.response = response
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # bytes on an idle connection (a 408 before closing): not ours to read
            self.abort()
        else:
            response.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.lost(exc)
        else:
            self.client.forget(self)

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def done(self, reuse: bool) -> None:
        """The current response is finished with: pool the connection when `reuse`, else drop it."""
        self.response = None
        if reuse:
            self.client.put(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """One response: its status and headers, then its body as it arrives (httptools calls the `on_*`)."""

    __slots__ = ("status", "headers", "read_timeout", "got_bytes", "_connection", "_parser", "_chunks",
                 "_buffered", "_paused", "_head_done", "_complete", "_keep_alive", "_error", "_waiter",
                 "_finished", "_whole", "_pending", "_head_fed", "_fields")

    def __init__(self, connection: Connection, read_s: float | None) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-case names
        self._fields = self.headers  # where `on_header` writes
        self.read_timeout = read_s  # per read; None: no timeout (a watchdog keeps one)
        self.got_bytes = False
        self._connection = connection
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._head_done = False
        self._complete = False
        self._keep_alive = False
        self._error: ClientFailure | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False  # released or closed
        self._whole = False  # read() wants the whole body: never pause
        self._pending = b""  # the start of a head that has not ended yet
        self._head_fed = False  # the final response's head went to the parser

    # -- fed by the connection ------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self.got_bytes = True
        parser = self._parser
        if parser is None:  # bytes after the response ended: nothing a replica may send, so not reused
            self._keep_alive = False
            self._connection.abort()
            return
        if not self._head_fed:
            data = self._final_head(data)
            if not data:
                return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as err:
            if self._complete:  # bytes after the end in the same read: the response stands, the connection goes
                self._keep_alive = False
            else:
                self._fail(UpstreamClosed(f"malformed response from the replica: {err}"))
            self._connection.abort()

    def _final_head(self, data: bytes) -> bytes:
        """What the parser gets once the final response's head is whole: interim responses (1xx, RFC 9110
        §15.2) dropped, folded lines unfolded (RFC 9112 §5.2), sizes checked; b"" while the head is incomplete
        (kept until the next read) or refused."""
        if self._pending:
            data = self._pending + data
            self._pending = b""
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if data.count(b"\n") != data.count(b"\r\n"):  # a bare LF: the parser refuses it, let it say so
                    self._head_fed = True
                    return data
                return self._keep_head(data)
            end += 4
            if end > MAX_LINE and (end > MAX_HEAD or data.find(b"\r\n") > MAX_LINE):
                return self._refuse_head(f"a response head over {MAX_HEAD if end > MAX_HEAD else MAX_LINE} bytes")
            if data[9] != 0x31 or not _is_interim(data):  # the first test spares a call for most heads
                self._head_fed = True
                if data.find(b"\r\n ", 0, end) >= 0 or data.find(b"\r\n\t", 0, end) >= 0:
                    data = _OBS_FOLD.sub(b" ", data[:end]) + data[end:]
                    end = data.find(b"\r\n\r\n") + 4
                if (end > MAX_FIELD or data.count(b"\n", 0, end) > MAX_HEADERS + 2) and (refused := _oversized(data[:end])):
                    return self._refuse_head(refused)
                return data
            if data[9:12] == b"101":  # never asked for (no Upgrade header is sent): the connection is not HTTP now
                return self._refuse_head("the replica switched protocols (101) unasked")
            data = data[end:]  # 100 Continue, 103 Early Hints...: read and discarded
            if not data:
                return b""

    def _keep_head(self, data: bytes) -> bytes:
        if len(data) > MAX_HEAD:
            return self._refuse_head(f"a response head over {MAX_HEAD} bytes")
        self._pending = data
        return b""

    def _refuse_head(self, reason: str) -> bytes:
        self._fail(UpstreamClosed(f"malformed response from the replica: {reason}"))
        self._connection.abort()
        return b""

    def lost(self, exc: Exception | None) -> None:
        if self._complete:
            return
        if self._head_done and exc is None and self._until_close():
            self._complete = True  # a body delimited by the connection's end
            self._wake()
        else:
            reason = f": {exc}" if exc is not None else ""
            where = "before its response ended" if self._head_done else "before answering"
            self._fail(UpstreamClosed(f"the replica closed the connection {where}{reason}"))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self._complete or self._parser is None:  # a second response after ours (in the same read): see `feed`
            raise UpstreamClosed("the replica sent bytes after its response")
        self._fields = {}  # trailers after a chunked body land there: they are not the response's headers
        self.status = self._parser.get_status_code()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._whole and not self._paused:
            self._paused = True
            self._connection.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        assert self._parser is not None
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._parser = None  # it holds our methods: dropping it here spares the GC a cycle per request
        self._wake()

    # -- read by the proxy ----------------------------------------------------------------------------

    async def head(self) -> None:
        """Wait for the status line and headers."""
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read(self) -> bytes:
        """The whole body; the connection then goes back to the pool."""
        self._whole = True
        if self._paused:
            self._resume()
        while not self._complete:
            if self._error is not None:
                raise self._error
            await self._wait()
        body = self._take()
        self.release()
        return body

    async def readany(self) -> bytes:
        """What has arrived of the body since the last read, waiting for some; b"" at its end."""
        while not self._chunks:
            if self._complete:
                return b""
            if self._error is not None:
                raise self._error
            await self._wait()
        return self._take()

    def read_nowait(self) -> bytes:
        """What has arrived and was not read yet, without waiting."""
        return self._take() if self._chunks else b""

    def release(self) -> None:
        """Done with the response: the connection is reused when the body ended whole (else closed)."""
        if not self._finished:
            self._finished = True
            self._parser = None  # see on_message_complete
            reuse = self._complete and self._keep_alive and self._error is None
            if reuse and self._paused:  # the body ended whole while unread: reading resumes before pooling
                self._resume()
            self._connection.done(reuse)

    def close(self) -> None:
        """Drop the connection (the replica sees the cancel); a read waiting on it fails."""
        if not self._finished:
            self._finished = True
            self._connection.done(False)
        if not self._complete:
            self._fail(UpstreamClosed("the response was closed"))

    # -- internals ------------------------------------------------------------------------------------

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    def _resume(self) -> None:
        self._paused = False
        self._connection.resume_reading()

    def _until_close(self) -> bool:
        """The body has neither a length nor chunks: it ends when the connection does."""
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")

    def _fail(self, error: ClientFailure) -> None:
        self._parser = None  # see on_message_complete
        if self._error is None:
            self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        loop = self._connection.loop
        waiter = self._waiter = loop.create_future()
        timer = None if self.read_timeout is None else loop.call_at(
            loop.time() + self.read_timeout, self._time_out, waiter)
        try:
            await waiter
        except BaseException:  # timed out, failed, or cancelled (the client left): the connection is done
            self.close()
            raise
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def _time_out(self, waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(ReadTimeout(f"the replica sent nothing in {self.read_timeout:g} s"))
