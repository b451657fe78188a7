"""The request body at the edge: its declared type, its encoding, its size and the time it may take.

    Content-Type       application/json or a +json type (parameters such as charset allowed); none at
                       all is read as JSON; any other is a 400 naming Content-Type, as OpenAI answers
    Content-Encoding   identity, gzip or deflate, decoded here (aiohttp's own decoding is off: it
                       would answer encodings it cannot decode with a plain-text 400 before any
                       handler runs); any other is a 415; a body that does not decode is a 400
    size               at most the policy's max_body_bytes, counted decoded, read no further (413)
    time               the whole body within client_limits' body_timeout_s (408)
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError

from gateway.errors import BodyTooLarge, InvalidRequest, RequestTimeout, UnsupportedMediaType

JSON = "application/json"
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # deflate in HTTP is the zlib format
ENCODINGS = ("identity", *WBITS)


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The decoded body, at most `limit` bytes within `timeout_s`, or a GatewayError naming the header or
    limit at fault."""
    decoder = _decoder(request)
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge(f"the request body of {request.content_length} bytes exceeds the limit of {limit} bytes")
    if decoder is None and request.content.is_eof():  # the whole body came with the headers: nothing to wait for
        whole = request.content.read_nowait()
        if len(whole) > limit:
            raise BodyTooLarge(f"the request body exceeds the limit of {limit} bytes")
        return whole
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for piece in request.content.iter_any():
                # at most one byte over the limit is decoded: enough to know (a small bomb stays small)
                raw += decoder.decompress(piece, limit + 1 - len(raw)) if decoder else piece
                if len(raw) > limit:
                    raise BodyTooLarge(f"the request body exceeds the limit of {limit} bytes")
        if decoder is not None and (not decoder.eof or decoder.unused_data):
            raise zlib.error("the compressed data ends early" if not decoder.eof else "data after the end")
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    except zlib.error as err:
        encoding = request.headers[hdrs.CONTENT_ENCODING]
        raise InvalidRequest(f"the request body is not valid {encoding}: {err}", param=hdrs.CONTENT_ENCODING,
                             code="invalid_encoding") from None
    except RequestPayloadError as err:  # broken chunked framing
        raise InvalidRequest(f"the request body could not be read: {err}", code="invalid_body") from None
    return bytes(raw)


def _decoder(request: web.Request) -> zlib._Decompress | None:
    """Check Content-Type and Content-Encoding; the decoder of the encoding (None: identity)."""
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if declared is not None and declared != JSON and request.content_type != JSON \
            and not request.content_type.endswith("+json"):  # (the exact common header skips aiohttp's parse)
        raise InvalidRequest(f"Content-Type {declared!r} is not supported: send the body as {JSON}",
                             param=hdrs.CONTENT_TYPE, code="unsupported_content_type")
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise UnsupportedMediaType(f"Content-Encoding {request.headers[hdrs.CONTENT_ENCODING]!r} is not "
                                   f"supported: send one of {', '.join(ENCODINGS)}", param=hdrs.CONTENT_ENCODING)
    return zlib.decompressobj(WBITS[encoding]) if encoding in WBITS else None
