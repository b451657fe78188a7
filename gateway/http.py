"""The HTTP edge: the only code that sees aiohttp's web.Request. Turns requests into contexts,
replies into responses, and GatewayError into the OpenAI error JSON."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

import orjson
import structlog
from aiohttp import web

from gateway.edge.accounted import (
    account_refusal, accounted, edge_context, new_context, probe, refuse, self_accounted,
)
from gateway.backends.tier_health import backends_health
from gateway.body import JSON, read_body
from gateway.context import RequestContext
from gateway.edge.keys import api_key, bearer
from gateway.edge.server import ON_REFUSAL, OnRefusal
from gateway.edge.whole import WholeResponse
from gateway.errors import (
    AuthenticationFailed, GatewayError, MethodNotAllowed, NotFound, Overloaded, UpstreamError, error_body,
)
from gateway.experiments.feedback import feedback_per_minute, submit_feedback
from gateway.openapi import openapi_spec
from gateway.protocols import WIRES
from gateway.protocols.anthropic_count import count_input_tokens
from gateway.protocols.base import Wire, render
from gateway.server import LIFECYCLE
from gateway.routing.sessions import SESSION_HEADER
from gateway.stages.policy import resolve_tenant
from gateway.state import GATEWAY, Gateway
from gateway.types import AUTO_MODEL, CLIENT_CLOSED_STATUS, Endpoint, Outcome, StreamReply

COUNT_TOKENS = "/v1/messages/count_tokens"  # Anthropic's, in its error shape like /v1/messages
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
POST_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings",
              "/v1/feedback", COUNT_TOKENS)

log = structlog.get_logger("gateway.http")


def add_routes(app: web.Application) -> None:
    """The gateway's endpoints: the request path's, which log their own answers, and the others, `accounted`."""
    on_refusal: OnRefusal = partial(account_refusal, app)  # requests aiohttp's parser refuses (gateway.edge.server)
    app[ON_REFUSAL] = on_refusal
    app.router.add_post("/v1/chat/completions", self_accounted(partial(serve, endpoint="chat")))
    app.router.add_post("/v1/completions", self_accounted(partial(serve, endpoint="completions")))
    app.router.add_post("/v1/embeddings", self_accounted(partial(serve, endpoint="embeddings")))
    app.router.add_post("/v1/feedback", accounted(feedback))
    for path, wire in WIRES.items():
        app.router.add_post(path, self_accounted(_translated(wire)))
    app.router.add_post(COUNT_TOKENS, accounted(count_message_tokens))
    app.router.add_get("/v1/models", accounted(models))
    app.router.add_get("/healthz", probe(healthz))
    app.router.add_get("/readyz", probe(readyz))
    app.router.add_get("/metrics", probe(metrics))
    app.router.add_get("/openapi.json", accounted(openapi))
    app.router.add_route("*", "/{tail:.*}", accounted(not_found))


# The request path's handlers are `serve` itself with the endpoint bound (a partial, not a coroutine around it:
# one frame less on every request and every resume of it; aiohttp takes a partial of a coroutine function).
def _translated(wire: Wire) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    return partial(serve, endpoint="chat", wire=wire)


async def count_message_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens (Anthropic): {"input_tokens": N}; errors in Anthropic's shape. Within the
    tenant's rate limit (a request, no tokens: no backend runs); its log line costs 0 (`gateway.edge.accounted`)."""
    gateway = request.app[GATEWAY]
    wire = WIRES["/v1/messages"]  # the same key header, body checks and error shape
    ctx = edge_context(request)
    try:
        ctx.tenant = resolve_tenant(gateway.config, api_key(request.headers, wire.key_header))
        if gateway.limiter is not None:
            await gateway.limiter.admit(ctx.tenant, 0)
        raw = await read_body(request, gateway.config.policy.max_body_bytes, gateway.client_limits.body_timeout_s)
        body = count_input_tokens(gateway.config, ctx.tenant, raw, gateway.accountant.input_tokens)
    except GatewayError as err:
        return refuse(request, err, wire)
    return web.Response(body=body, content_type=JSON, headers={"x-request-id": ctx.request_id})


async def serve(request: web.Request, endpoint: Endpoint, wire: Wire | None = None) -> web.StreamResponse:
    """One request through the request path (`gateway.pipeline`): its reply, or its error in the client's
    protocol; then, whatever happened, accounting and the stages' finishers."""
    gateway = request.app[GATEWAY]
    path = gateway.path
    if path is None:  # aiohttp serves only once the resources are open: a guard, not a state
        return web.Response(body=error_body(Overloaded("the gateway is starting")), status=503, content_type=JSON)
    ctx = new_context(gateway, request.path, endpoint, wire)
    ctx.session_header = request.headers.get(SESSION_HEADER)
    if gateway.tracing is not None:
        ctx.trace = gateway.tracing.start(request.headers, ctx)
        ctx.finishers.append(ctx.trace.finish)
    gateway.metrics.in_flight.inc()
    reply = None
    try:
        ctx.api_key = api_key(request.headers, wire.key_header if wire is not None else None)  # 401: not UTF-8
        ctx.raw_body = await read_body(request, ctx.config.policy.max_body_bytes,
                                       gateway.client_limits.body_timeout_s)
        reply = await path.run(ctx)
        if wire is not None:
            reply = render(wire, ctx, reply, gateway.accountant.count_tokens)
        if isinstance(reply, StreamReply):
            return await _stream(request, ctx, reply, gateway.client_limits.write_timeout_s)
        ctx.result.status = reply.status
        headers = _headers(ctx, reply.headers)
        return WholeResponse(reply.body, reply.status, headers)
    except GatewayError as err:
        return _error(ctx, err, "upstream_error" if isinstance(err, UpstreamError) else "rejected")
    except ConnectionResetError:
        ctx.result.status, ctx.result.outcome = CLIENT_CLOSED_STATUS, "client_disconnected"
        return web.Response(status=CLIENT_CLOSED_STATUS)
    except asyncio.CancelledError:
        ctx.result.status, ctx.result.outcome = CLIENT_CLOSED_STATUS, "client_disconnected"
        raise
    except Exception:
        log.exception("internal_error", request_id=ctx.request_id)
        return _error(ctx, GatewayError(f"internal error (request {ctx.request_id})"), "internal_error")
    finally:
        if isinstance(reply, StreamReply):
            reply.source.close()
        gateway.metrics.in_flight.dec()
        path.finish(ctx)


async def _stream(request: web.Request, ctx: RequestContext, reply: StreamReply,
                  write_timeout_s: float) -> web.StreamResponse:
    response = web.StreamResponse(headers=_headers(ctx, {**SSE_HEADERS, **reply.headers}))
    ctx.result.status = 200
    await response.prepare(request)
    transport = request.transport
    # A chunk under half the high-water mark into an empty buffer cannot pause the writer, so it
    # cannot block: only other writes get a timer (none per token while the client keeps up).
    safe = transport.get_write_buffer_limits()[1] // 2 if transport is not None else 0
    async for chunk in reply.source.chunks():
        if transport is None or (len(chunk) < safe and not transport.get_write_buffer_size()):
            await response.write(chunk)
        elif not await _write_behind(response, transport, ctx, chunk, write_timeout_s):
            return response
    await response.write_eof()
    return response


async def _write_behind(
    response: web.StreamResponse, transport: asyncio.Transport, ctx: RequestContext, chunk: bytes, timeout_s: float
) -> bool:
    """Write to a client that is behind; one that takes nothing for `timeout_s` is dropped
    (the caller's `finally` then cancels the upstream). False when it was dropped."""
    try:
        async with asyncio.timeout(timeout_s):
            await response.write(chunk)
    except TimeoutError:
        ctx.result.status, ctx.result.outcome, ctx.result.error = CLIENT_CLOSED_STATUS, "client_disconnected", "client_write_timeout"
        log.warning("client_write_timeout", request_id=ctx.request_id, timeout_s=timeout_s,
                    buffered_bytes=transport.get_write_buffer_size())
        transport.abort()  # close() would wait for the unread buffer to flush
        return False
    return True


def _headers(ctx: RequestContext, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    headers = {"x-request-id": ctx.request_id}
    if ctx.route.tier is not None:
        headers["x-gateway-tier"] = ctx.route.tier.name
    if ctx.route.rerouted_from is not None:
        headers["x-gateway-rerouted-from"] = ctx.route.rerouted_from
    if ctx.route.spill is not None and (spilled := ctx.route.spill.spilled_from) is not None:
        headers["x-gateway-spilled-from"] = spilled
    if ctx.escalation is not None and ctx.escalation.outcome == "escalated":
        headers["x-gateway-escalated-from"] = ctx.escalation.from_tier.name
    if ctx.upstream.replica is not None:
        headers["x-gateway-backend"] = ctx.upstream.replica.name
    if ctx.route.session_route is not None:  # held: the session's tier served, not the lower one routed (issue 32)
        headers["x-gateway-session"] = ctx.route.session_route if ctx.route.session_from is None else f"held from {ctx.route.session_from}"
    if ctx.route.difficulty is not None:
        headers["x-gateway-difficulty"] = f"{ctx.route.difficulty:.4f}"
    if ctx.route.quality_choice is not None:
        headers["x-gateway-quality"] = ",".join(f"{o.tier}={o.quality:.4f}" for o in ctx.route.quality_choice.options)
    if ctx.route.route_reason is not None:
        headers["x-gateway-route-reason"] = ctx.route.route_reason
    if ctx.assignment is not None:
        headers["x-gateway-arm"] = ctx.assignment.header
    if ctx.max_tokens_asked is not None:
        headers["x-gateway-max-tokens-clamped"] = f"{ctx.max_tokens_asked}->{ctx.max_tokens}"
    if extra:
        headers.update(extra)
    return headers


def _error(ctx: RequestContext, err: GatewayError, outcome: Outcome) -> web.StreamResponse:
    ctx.result.status = err.status
    ctx.result.outcome = outcome
    ctx.result.error = ctx.result.error or err.code or err.type
    headers = _headers(ctx, err.headers())
    body = error_body(err) if ctx.wire is None else ctx.wire.error_body(err)
    return WholeResponse(body, err.status, headers)


async def feedback(request: web.Request) -> web.Response:
    """POST /v1/feedback: a score in [0, 1] (or thumbs up/down) for one of the caller's tenant's answers, by its
    x-request-id (`gateway.experiments.feedback`). An API key is required, even where anonymous requests are allowed."""
    gateway = request.app[GATEWAY]
    try:
        key = bearer(request.headers)
        if key is None:
            raise AuthenticationFailed("feedback needs an API key: send 'Authorization: Bearer <key>'")
        tenant = edge_context(request).tenant = resolve_tenant(gateway.config, key)
        if gateway.owners is None:  # aiohttp serves only once the resources are open: a guard, not a state
            raise Overloaded("the gateway is starting")
        raw = await read_body(request, gateway.config.policy.max_body_bytes, gateway.client_limits.body_timeout_s)
        reply = await submit_feedback(raw, tenant.name, gateway.owners, gateway.feedback,
                                      limiter=gateway.feedback_limiter, per_min=feedback_per_minute(
                                          tenant.rate_limit.requests_per_min if tenant.rate_limit else None))
    except GatewayError as err:
        return refuse(request, err)
    return web.Response(body=orjson.dumps(reply), content_type=JSON)


async def models(request: web.Request) -> web.Response:
    gateway: Gateway = request.app[GATEWAY]
    created = int(gateway.config.loaded_at)
    names = [AUTO_MODEL, *gateway.config.tiers]
    data = [{"id": n, "object": "model", "created": created, "owned_by": "gateway"} for n in names]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type=JSON)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type=JSON)


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    lifecycle = request.app.get(LIFECYCLE)
    draining = lifecycle is not None and lifecycle.draining
    ready = gateway.path is not None and not draining
    redis_status = gateway.redis.status() if gateway.redis is not None else None
    redis = "off" if redis_status is None else redis_status.state  # up, partial (cluster: masters down), down
    status = "draining" if draining else "ready" if ready else "starting"
    routes = gateway.config.routes
    backends, by_tier = backends_health(gateway.pool, routes.tiers, routes.balancing.health_interval_s)
    body = {"status": status, "config_version": gateway.config.version, "tiers": list(gateway.config.tiers),
            "redis": redis, "limits": {"up": "global", "partial": "partial"}.get(redis, "local"),
            "redis_nodes_down": list(redis_status.nodes_down) if redis_status else [],  # host:port, or * (all)
            "redis_slots_unavailable": redis_status.slots_unavailable if redis_status else 0,  # of 16384
            "replicas": gateway.replicas.count if gateway.replicas else 1,  # gateway processes sharing Redis
            "backends": backends, "backend_tiers": by_tier}  # gateway.backends.tier_health: the rule
    return web.Response(body=orjson.dumps(body), status=200 if ready else 503, content_type=JSON)


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(openapi_spec(request.app[GATEWAY].config)), content_type=JSON)


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]  # series naming tenants only with a metrics key (gateway.metrics)
    return gateway.metrics.scrape(request.headers.get("Authorization"), gateway.config.policy)


async def not_found(request: web.Request) -> web.Response:
    err: GatewayError
    if request.path in POST_PATHS:
        err = MethodNotAllowed(f"{request.method} is not allowed on {request.path}; use POST")
    else:
        err = NotFound(f"no route for {request.method} {request.path}")
    return refuse(request, err, WIRES.get("/v1/messages" if request.path == COUNT_TOKENS else request.path))
