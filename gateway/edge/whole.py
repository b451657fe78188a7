"""A reply whose body is bytes in hand, written whole: the request path's JSON answers and errors.

aiohttp's `web.Response` sends such a body as this does (status line, the handler's headers, Content-Type,
Content-Length, Date, Server, Connection as keep-alive asks; headers and body in one write), but on the way
it builds for what a bytes body never has: a payload object (two ABC checks), compression, chunking, cookies,
a content type parsed from its parameters. About 25,000 instructions a request, a tenth of the gateway's
own; `WholeResponse` skips those, and hands anything else (a HEAD request, a status with no body) to
aiohttp's own path. aiohttp is pinned (pyproject.toml): `tests/unit/test_whole_response.py` compares the
bytes on the wire with `web.Response`'s, request by request (HTTP/1.1 and 1.0, keep-alive or not).
"""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import must_be_empty_body, rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion10, HttpVersion11
from multidict import CIMultiDict

JSON = "application/json"


class WholeResponse(web.Response):
    """`web.Response(body=body, status=status, headers=headers, content_type=content_type)`, sent whole."""

    def __init__(self, body: bytes, status: int = 200, headers: Mapping[str, str] | None = None,
                 content_type: str = JSON) -> None:
        real: CIMultiDict[str] = CIMultiDict() if headers is None else CIMultiDict(headers)
        real[hdrs.CONTENT_TYPE] = content_type
        web.StreamResponse.__init__(self, status=status, _real_headers=real)
        self._body = body

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        if self._payload_writer is not None:
            return self._payload_writer
        if self._compression or self._chunked or self._cookies or must_be_empty_body(request.method, self.status):
            return await super().prepare(request)  # (never on the request path: aiohttp's own way)
        self._must_be_empty_body = False
        self._req = request
        writer = self._payload_writer = request._payload_writer
        keep_alive = self._keep_alive
        if keep_alive is None:
            keep_alive = self._keep_alive = request.keep_alive
        headers = self._headers
        body = self._body
        assert isinstance(body, bytes) and writer is not None
        writer.length = len(body)
        headers[hdrs.CONTENT_LENGTH] = str(len(body))
        if hdrs.DATE not in headers:
            headers[hdrs.DATE] = rfc822_formatted_time()
        headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
        version = request.version
        if hdrs.CONNECTION not in headers:
            if keep_alive:
                if version == HttpVersion10:
                    headers[hdrs.CONNECTION] = "keep-alive"
            elif version == HttpVersion11:
                headers[hdrs.CONNECTION] = "close"
        await request._prepare_hook(self)
        await writer.write_headers(f"HTTP/{version[0]}.{version[1]} {self._status} {self._reason}", headers)
        return writer

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        if self._must_be_empty_body or self._compressed_body is not None:
            return await super().write_eof(data)
        writer = self._payload_writer
        assert not data and writer is not None
        await writer.write_eof(self._body)  # type: ignore[arg-type]  # bytes (the constructor's)
        self._eof_sent = True
        self._req = None
        self._body_length = writer.output_size
        self._payload_writer = None
