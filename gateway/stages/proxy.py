"""Proxy: send the request to the tier's replicas in rank order until one answers, then relay it.

A replica that fails before the first byte (connection refused, timeout, 5xx, 429) is skipped for
the next one, up to `upstream.max_attempts` and while the retry budget lasts; after the first byte
the relay owns the stream. The first byte's time feeds the replica's TTFT statistics and the hooks
of other stages (the admission limiter).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import structlog

from gateway.backends.idle import IdleWatchdog
from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.relay import SseRelay, apply_usage
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.errors import (
    GatewayError, Overloaded, UpstreamError, UpstreamOverloaded, UpstreamStatus, UpstreamTimeout,
)
from gateway.metrics import GatewayMetrics
from gateway.protocols.native import ResponsesScanner, is_native, settle as settle_native, upstream_body as native_body
from gateway.sse import OutputLimit, SseScanner
from gateway.types import JsonReply, Reply, StreamReply

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
PATHS = {"chat": "/chat/completions", "completions": "/completions"}
JSON_HEADERS = {"Content-Type": "application/json"}
MAX_ERROR_BODY = 64 * 1024

log = structlog.get_logger("gateway.proxy")


class Retry(Exception):
    """This replica failed before the first byte; try the next one."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message)
        self.error = error


class ProxyStage:
    def __init__(
        self, session: aiohttp.ClientSession, pool: ReplicaPool, watchdog: IdleWatchdog, metrics: GatewayMetrics,
        count_tokens: Callable[[RequestContext], None],
    ) -> None:
        self._session = session
        self._pool = pool
        self._watchdog = watchdog
        self._metrics = metrics
        self._count_tokens = count_tokens  # the account stage's counts, for a usage chunk the backend left out

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        settings = ctx.config.routes.upstream
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
        )
        if not ctx.candidates and ctx.tier is not None:
            ctx.error = "no_replica_available"
            raise Overloaded(f"no replica of tier {ctx.tier.name!r} is available (circuit open or failing health "
                             "checks)", code="no_replica_available", retry_after=self._pool.retry_in(ctx.tier))
        budget = self._pool.retries
        budget.on_request()
        last: GatewayError = UpstreamError("the tier has no replica to try")
        for replica in ctx.candidates[: settings.max_attempts]:
            if ctx.attempts and not budget.try_retry(ctx.config.routes.balancing.retry_budget):
                self._metrics.retries.labels("budget_exhausted").inc()
                log.warning("retry_budget_exhausted", request_id=ctx.request_id, backend=replica.name)
                break
            if ctx.attempts:
                self._metrics.retries.labels("sent").inc()
            ctx.attempts += 1
            ctx.replica = replica
            try:
                return await self._attempt(ctx, replica, timeout)
            except Retry as retry:
                last = retry.error
                self._metrics.upstream_failures.labels(replica.name).inc()
                log.warning("upstream_attempt_failed", request_id=ctx.request_id, backend=replica.name,
                            attempt=ctx.attempts, reason=retry.error.message)
        ctx.error = last.code or last.type
        raise last

    async def _attempt(self, ctx: RequestContext, replica: Replica, timeout: aiohttp.ClientTimeout) -> Reply:
        lease = Lease(self._pool, replica, ctx)
        try:
            response = await self._post(ctx, replica, timeout)
            if response.status != 200:
                error = await _status_error(response, replica)
                retryable = response.status in RETRYABLE_STATUS
                lease.release(failed=retryable)
                raise Retry(error) if retryable else error
            ctx.upstream_started = True
            if not ctx.stream:
                reply = await _settle_json(ctx, response, replica)
                lease.release()  # estimates when the first token came
                _first_byte(ctx, None, lease.first_at)
                return reply
            first = await _first_bytes(response, replica)
            _first_byte(ctx, lease)
        except Retry:
            lease.release(failed=True)
            raise
        except BaseException:
            lease.release()
            raise
        cap = ctx.tenant.output_cap if ctx.tenant else None
        limit = OutputLimit(cap.tokens, cap.chars) if cap else None
        scanner = (ResponsesScanner if is_native(ctx) else SseScanner)(
            ctx.endpoint, forward_usage=ctx.client_wants_usage, collect_text=ctx.cache_key is not None, limit=limit)
        idle_s = ctx.config.routes.upstream.read_timeout_s
        return StreamReply(SseRelay(ctx, response, scanner, first, lease.release, self._watchdog, idle_s,
                                    self._count_tokens))

    async def _post(
        self, ctx: RequestContext, replica: Replica, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        native = is_native(ctx)  # a Responses request to a tier serving /responses itself
        body: dict[str, Any] = native_body(ctx, replica.model) if native else {**ctx.body, "model": replica.model}
        if ctx.stream and not native:
            body["stream_options"] = {"include_usage": True}
        # only the replica's own key from config: no client header is ever forwarded
        headers = JSON_HEADERS if replica.api_key is None else {**JSON_HEADERS,
                                                                "Authorization": f"Bearer {replica.api_key}"}
        if ctx.trace is not None:
            headers = {**headers, **ctx.trace.headers()}
        try:
            return await self._session.post(
                replica.url + ("/responses" if native else PATHS[ctx.endpoint]), data=orjson.dumps(body),
                headers=headers, timeout=timeout
            )
        except aiohttp.ConnectionTimeoutError:
            raise Retry(UpstreamTimeout(f"backend {replica.name} did not connect in time")) from None
        except TimeoutError:  # connected, but no response head within read_timeout_s (a stuck or busy backend)
            raise Retry(UpstreamTimeout(f"backend {replica.name} sent no first byte in time")) from None
        except aiohttp.ClientError as err:
            raise Retry(UpstreamError(f"backend {replica.name} is unreachable: {type(err).__name__}")) from None


def _first_byte(ctx: RequestContext, lease: Lease | None, at: float | None = None) -> None:
    """The upstream answered: tell the lease (the replica's TTFT) and the stages that asked."""
    now = at or time.perf_counter()
    if lease is not None:
        lease.first_byte(now)
    for hook in ctx.first_byte_hooks:
        hook(now)


async def _first_bytes(response: aiohttp.ClientResponse, replica: Replica) -> bytes:
    try:
        first = await response.content.readany()
    except TimeoutError:
        response.close()
        raise Retry(UpstreamTimeout(f"backend {replica.name} sent no first byte in time")) from None
    except aiohttp.ClientError as err:
        response.close()
        raise Retry(UpstreamError(f"backend {replica.name} failed before the first byte: {err}")) from None
    if not first:
        response.close()
        raise Retry(UpstreamError(f"backend {replica.name} closed the stream before the first byte"))
    return first


async def _settle_json(ctx: RequestContext, response: aiohttp.ClientResponse, replica: Replica) -> JsonReply:
    try:
        data = await response.read()
    except TimeoutError:
        raise Retry(UpstreamTimeout(f"backend {replica.name} did not answer in time")) from None
    except aiohttp.ClientError as err:
        raise Retry(UpstreamError(f"backend {replica.name} broke off its answer: {type(err).__name__}")) from None
    ctx.first_token_at = time.perf_counter()
    try:
        answer = orjson.loads(data)
        if is_native(ctx):
            ctx.response_text = settle_native(ctx, answer)
            return JsonReply(200, data)
        choice = answer["choices"][0]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise Retry(UpstreamError(f"backend {replica.name} sent a malformed answer")) from None
    ctx.finish_reason = choice.get("finish_reason")
    apply_usage(ctx, answer.get("usage"))
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    ctx.response_text = text if isinstance(text, str) else None
    cap = ctx.tenant.output_cap.chars if ctx.tenant and ctx.tenant.output_cap else None
    if cap is not None and ctx.response_text is not None and len(ctx.response_text) > cap:
        data = _trim_answer(answer, choice, ctx.response_text[:cap])
        ctx.response_text, ctx.finish_reason, ctx.output_capped = ctx.response_text[:cap], "length", True
    return JsonReply(200, data)


def _trim_answer(answer: dict[str, Any], choice: dict[str, Any], text: str) -> bytes:
    """The answer with its text cut to the tenant's character cap (finish_reason "length")."""
    if isinstance(choice.get("message"), dict):
        choice["message"] = {**choice["message"], "content": text}
    else:
        choice["text"] = text
    choice["finish_reason"] = "length"
    return orjson.dumps(answer)


async def _status_error(response: aiohttp.ClientResponse, replica: Replica) -> GatewayError:
    """Turn an upstream non-200 into our error, keeping the upstream's message for 4xx."""
    try:
        raw = await response.content.read(MAX_ERROR_BODY)
    except (aiohttp.ClientError, TimeoutError):
        raw = b""
    finally:
        response.release()
    message = raw.decode("utf-8", "replace")[:500]
    try:
        message = orjson.loads(raw)["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    retry_after = response.headers.get("Retry-After")
    delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
    if response.status == 429:
        return UpstreamOverloaded(f"backend {replica.name} is rate limiting (429): {message}", retry_after=delay)
    if response.status >= 500 or response.status in RETRYABLE_STATUS:
        return UpstreamError(f"backend {replica.name} answered {response.status}: {message}", retry_after=delay)
    return UpstreamStatus(response.status, f"the backend refused the request: {message}", retry_after=delay)
