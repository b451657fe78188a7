"""Requests aiohttp's HTTP parser refuses, answered in the OpenAI error shape, logged once, without a traceback.

aiohttp answers a request it cannot parse (Content-Length beside Transfer-Encoding, a header line over 8190
bytes, more than 128 headers, a bad request line) before any handler or middleware runs:
`RequestHandler.handle_error` writes a plain-text 400 and logs the exception with its traceback. `EdgeRunner`
serves an app through `EdgeProtocol`, whose `handle_error` answers 400 (431 for headers too large, as RFC 6585
says) with the OpenAI error JSON, calls the app's `ON_REFUSAL` (the gateway writes the request-log line) and
logs no traceback. An exception that escapes a handler (a bug: the gateway's handlers answer their own
errors) is still logged, and answered as an OpenAI-shaped 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from gateway.errors import GatewayError, InvalidRequest, error_body

OnRefusal = Callable[[GatewayError], str]  # logs a refused request; returns its request id
ON_REFUSAL: web.AppKey[OnRefusal] = web.AppKey("on_refusal")
TOO_MANY_HEADERS = "Too many headers received"

log = structlog.get_logger("gateway.server")


class HeadersTooLarge(InvalidRequest):
    status = 431
    code = "request_header_fields_too_large"


def refusal(exc: BaseException) -> GatewayError:
    """The answer to a request the parser refused with `exc`: the rule broken, in at most 120 characters."""
    if isinstance(exc, LineTooLong) or (isinstance(exc, HttpProcessingError) and exc.message == TOO_MANY_HEADERS):
        return HeadersTooLarge("the request line or headers are too large: at most 8190 bytes a line, 128 headers")
    reason = exc.message if isinstance(exc, HttpProcessingError) else ""
    first = reason.splitlines()[0].rstrip(":")[:120] if reason else "malformed"
    return InvalidRequest(f"the HTTP request could not be parsed: {first}", code="bad_http_request")


class EdgeProtocol(RequestHandler):
    """aiohttp's connection handler, with the gateway's answer to requests it cannot parse."""

    def __init__(self, manager: EdgeServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.on_refusal = manager.on_refusal

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: the answer already started, the connection is broken
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        headers: dict[str, str] = {}
        if isinstance(exc, HttpProcessingError):
            err = refusal(exc)
            if self.on_refusal is not None:
                headers["x-request-id"] = self.on_refusal(err)
        else:
            log.error("unhandled_error", exc_info=exc)
            err = GatewayError("internal error")
        response = web.Response(body=error_body(err), status=err.status, headers=headers,
                                content_type="application/json")
        response.force_close()
        return response


class EdgeServer(web.Server):
    """aiohttp's low-level server, making `EdgeProtocol` connections."""

    on_refusal: OnRefusal | None = None

    def __call__(self) -> RequestHandler:
        return EdgeProtocol(self, loop=self._loop, **self._kwargs)


class EdgeRunner(web.AppRunner):
    """An AppRunner whose connections answer parser refusals through `EdgeProtocol`."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts the app, and makes aiohttp's own server: its settings
        server = EdgeServer(made.request_handler, request_factory=made.request_factory,
                            handler_cancellation=made.handler_cancellation, loop=made._loop, **made._kwargs)
        server.on_refusal = self.app.get(ON_REFUSAL)
        return server
