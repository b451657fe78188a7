"""Every answer accounted for: one request-log line, with the status the client saw, for every request that
reached the gateway, whichever endpoint answered it.

The request path's endpoints (`gateway.http.serve`) write their own line through `RequestPath.finish`, and
are registered as `self_accounted`. Every other endpoint (count_tokens, feedback, admin, dashboard, models,
probes, unknown paths, static files) is registered wrapped in `accounted`, which gives the handler a context
(`edge_context`), settles it after the answer, and turns an unexpected exception into an OpenAI-shaped 500
(logged once). Not a middleware: an aiohttp middleware (and the one aiohttp adds beside it) is two more
coroutines around every request, the request path's too (~5 us a request, issue 37). `unaccounted` names any
route registered otherwise; the app refuses to start with one. Handlers refuse with `refuse`, which puts the
error's code in the line. Requests aiohttp's parser refuses before any handler runs get their line from
`account_refusal` (`gateway.edge.server`).

These lines have the request path's shape (cost 0: no backend ran; `path` says which endpoint) but feed
neither the serving metrics nor the dashboard: its own polls would count as traffic. One exception: a
`probe` (/healthz, /readyz, /metrics: the orchestrator's and Prometheus's, every few seconds) answered
below 400 writes no line; a probe refused or failing does.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from gateway.context import RequestContext
from gateway.edge.keys import decodable
from gateway.errors import GatewayError, error_body
from gateway.edge.request_ids import next_request_id
from gateway.state import GATEWAY, Gateway
from gateway.types import CLIENT_CLOSED_STATUS, ClientWire, Endpoint

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
EDGE_CONTEXT = web.RequestKey("edge_context", RequestContext)
JSON = "application/json"
MAX_PATH_CHARS = 256  # the path as logged: an unknown path is the client's, up to aiohttp's 8190 bytes

log = structlog.get_logger("gateway.http")
_SELF_ACCOUNTED: set[Handler] = set()
_ACCOUNTED: set[Handler] = set()  # the handlers `accounted` made


def self_accounted(handler: Handler) -> Handler:
    """Mark a handler that writes its own line (the request path's): registered as it is."""
    _SELF_ACCOUNTED.add(handler)
    return handler


def probe(handler: Handler) -> Handler:
    """`accounted` for a probe: its answer is logged only when it is a refusal or an error (status 400 and up)."""
    return accounted(handler, probe=True)


def unaccounted(app: web.Application) -> list[str]:
    """The routes of `app` whose handler writes no line: neither `accounted` nor `self_accounted`."""
    return [f"{route.method} {route.resource.canonical if route.resource else '?'}" for route in app.router.routes()
            if route.handler not in _ACCOUNTED and route.handler not in _SELF_ACCOUNTED]


def new_context(gateway: Gateway, path: str | None, endpoint: Endpoint = "chat",
                wire: ClientWire | None = None) -> RequestContext:
    """A request's context as it reaches the gateway: its id, clock, config version and path."""
    ctx = RequestContext(next_request_id(), endpoint, gateway.config, b"", None, time.perf_counter(), time.time(),
                         wire)
    ctx.path = path
    return ctx


def loggable_path(request: web.BaseRequest) -> str:
    """The request's raw path without its query (which may hold a secret), bounded, and valid UTF-8 (a log
    line cannot carry a lone surrogate)."""
    path = request.raw_path.partition("?")[0][:MAX_PATH_CHARS]
    return path if decodable(path) else path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def edge_context(request: web.Request) -> RequestContext:
    """The context `accounted` opened for this request."""
    return request[EDGE_CONTEXT]


def refuse(request: web.Request, err: GatewayError, wire: ClientWire | None = None) -> web.Response:
    """`err` as the answer, in the OpenAI error shape (or `wire`'s), and as the line's status and error."""
    ctx = edge_context(request)
    ctx.result.status, ctx.result.outcome, ctx.result.error = err.status, "rejected", err.code or err.type
    body = error_body(err) if wire is None else wire.error_body(err)
    return web.Response(body=body, status=err.status, content_type=JSON,
                        headers={"x-request-id": ctx.request_id, **err.headers()})


def accounted(handler: Handler, *, probe: bool = False) -> Handler:
    """`handler` with one line for its answer, whatever it is; a crash is an OpenAI-shaped 500. `probe`: a line
    only for a refusal or an error."""

    @functools.wraps(handler)
    async def answer(request: web.Request) -> web.StreamResponse:
        return await _account(request, handler, probe)

    _ACCOUNTED.add(answer)
    return answer


async def _account(request: web.Request, handler: Handler, probe: bool) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    ctx = request[EDGE_CONTEXT] = new_context(gateway, loggable_path(request))
    logged = True
    try:
        response = await handler(request)
        if not response.prepared:
            response.headers.setdefault("x-request-id", ctx.request_id)
        if isinstance(response, web.FileResponse):  # its status is known once sent: 200, 304, 206, 404, 416
            await response.prepare(request)
        if not ctx.result.status:  # not refused through `refuse`: the handler's own answer
            _finish(ctx, response.status)
        logged = ctx.result.status >= 400 or not probe
        return response
    except web.HTTPException as exc:  # redirects, and aiohttp's own answers
        exc.headers.setdefault("x-request-id", ctx.request_id)
        _finish(ctx, exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        ctx.result.status, ctx.result.outcome = CLIENT_CLOSED_STATUS, "client_disconnected"
        raise
    except Exception:
        log.exception("internal_error", request_id=ctx.request_id, path=ctx.path)
        response = refuse(request, GatewayError(f"internal error (request {ctx.request_id})"))
        ctx.result.outcome = "internal_error"
        return response
    finally:
        if logged:
            _settle(gateway, ctx)


def account_refusal(app: web.Application, err: GatewayError) -> str:
    """The line of a request refused before any handler ran (aiohttp's parser); returns its request id."""
    gateway = app[GATEWAY]
    ctx = new_context(gateway, None)
    ctx.result.status, ctx.result.outcome, ctx.result.error = err.status, "rejected", err.code or err.type
    _settle(gateway, ctx)
    return ctx.request_id


def _finish(ctx: RequestContext, status: int) -> None:
    ctx.result.status = status
    if status >= 400:
        ctx.result.outcome = "internal_error" if status >= 500 and status != 503 else "rejected"


def _settle(gateway: Gateway, ctx: RequestContext) -> None:
    try:
        gateway.accountant.settle(ctx, observe=False)
    except Exception:  # the line must never cost the answer
        log.exception("finisher_failed", request_id=ctx.request_id, step="settle")
