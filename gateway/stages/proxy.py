"""Proxy: send the request to the tier's replicas in rank order until one answers, then relay it.

A replica that fails before the first byte (connection refused, timeout, 5xx, 429) is skipped for
the next one, up to `upstream.max_attempts` and while the retry budget lasts (`stages.failover`);
after the first byte the relay owns the stream, and a stream that breaks goes on from another replica
(`stages.resume`). The first byte's time feeds the replica's TTFT statistics and the hooks of other stages
(the admission limiter).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.backends.h1 import Response, UpstreamClient
from gateway.backends.idle import IdleWatchdog
from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.relay import SseRelay
from gateway.backends.stats import server_decode_s
from gateway.backends.upstream import Retry, post, read_answer
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.errors import UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.protocols.anthropic import wants_stop_word
from gateway.protocols.native import ResponsesScanner, is_native, settle as settle_native, upstream_body as native_body
from gateway.sse import OutputLimit, SseScanner
from gateway.stages.answer import ContextSink, apply_usage
from gateway.stages.failover import answered, failover, first_byte, lease
from gateway.stages.resume import StreamResumes, first_bytes
from gateway.types import JsonReply, Reply, StreamReply

PATHS = {"chat": "/chat/completions", "completions": "/completions"}


class ProxyStage:
    def __init__(
        self, client: UpstreamClient, pool: ReplicaPool, watchdog: IdleWatchdog, metrics: GatewayMetrics,
        count_tokens: Callable[[RequestContext], None],
    ) -> None:
        self._client = client
        self._pool = pool
        self._watchdog = watchdog
        self._metrics = metrics
        self._count_tokens = count_tokens  # the account stage's counts, for a usage chunk the backend left out
        self.resumes = StreamResumes(client, pool, metrics, count_tokens)  # a broken stream goes on elsewhere

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        return await failover(ctx, self._pool, self._metrics, lambda replica: self._attempt(ctx, replica))

    async def _attempt(self, ctx: RequestContext, replica: Replica) -> Reply:
        """One replica's try. Until its relay exists, the attempt owns the replica's lease and the upstream
        response: any exception closes the response and releases the lease here, once (as the replica's
        failure on `Retry`). The relay then owns both (`SseRelay.close`, through `ContextSink.closed`)."""
        held = lease(ctx, self._pool, replica)
        response: Response | None = None
        try:
            response = await self._post(ctx, replica)
            ctx.upstream_started = True
            if not ctx.stream:
                reply, decode_s = await _settle_json(ctx, response, replica)
                answered(ctx, held, ctx.completion_tokens or 0, decode_s)  # a TTFT sample only if the server timed it
                return reply
            first = await first_bytes(response, replica)
            first_byte(ctx, held)
            return StreamReply(self._relay(ctx, response, first, held))
        except BaseException as err:
            if response is not None:
                response.close()  # a no-op once read whole
            held.release(failed=isinstance(err, Retry))  # a no-op once answered
            raise

    def _relay(self, ctx: RequestContext, response: Response, first: bytes, held: Lease) -> SseRelay:
        """The relay that takes over `response` and `held` from the attempt."""
        cap = ctx.tenant.output_cap if ctx.tenant else None
        limit = OutputLimit(cap.tokens, cap.chars) if cap else None
        resumer = None if is_native(ctx) else self.resumes.for_request(ctx, held)  # it needs the text sent
        scanner = (ResponsesScanner if is_native(ctx) else SseScanner)(
            ctx.endpoint, forward_usage=ctx.client_wants_usage,
            collect_text=ctx.cache_key is not None or ctx.keep_text or resumer is not None, limit=limit)
        sink = ContextSink(ctx, held, self._count_tokens)
        idle_s = ctx.config.routes.upstream.read_timeout_s
        return SseRelay(response, scanner, first, sink, self._watchdog, idle_s, max_tokens=ctx.max_tokens,
                        wants_usage=ctx.client_wants_usage, resumer=resumer)

    async def _post(self, ctx: RequestContext, replica: Replica) -> Response:
        native = is_native(ctx)  # a Responses request to a tier serving /responses itself
        body: dict[str, Any] = native_body(ctx, replica.model) if native else {**ctx.body, "model": replica.model}
        if not native and "max_completion_tokens" in body:  # llama-cpp-python reads only max_tokens: without
            body["max_tokens"] = body["max_completion_tokens"]  # it, a limit asked that way was ignored
        if ctx.stream and not native:
            body["stream_options"] = {"include_usage": True}
        if wants_stop_word(ctx, replica):  # llama.cpp names the stop sequence that matched only when asked
            body["verbose"] = True
        # only the replica's own key from config (`upstream.post`): no client header is ever forwarded
        return await post(self._client, replica, "/responses" if native else PATHS[ctx.endpoint], orjson.dumps(body),
                          ctx.config.routes.upstream, ctx.trace.headers() if ctx.trace is not None else None)


async def _settle_json(ctx: RequestContext, response: Response, replica: Replica) -> tuple[JsonReply, float | None]:
    """The answer for the client, and the seconds it spent decoding when the server says (`server_decode_s`)."""
    data = await read_answer(response, replica)
    ctx.first_token_at = time.perf_counter()
    try:
        answer = orjson.loads(data)
        if is_native(ctx):
            ctx.response_text = settle_native(ctx, answer)
            return JsonReply(200, data), None
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
    return JsonReply(200, data), server_decode_s(answer)


def _trim_answer(answer: dict[str, Any], choice: dict[str, Any], text: str) -> bytes:
    """The answer with its text cut to the tenant's character cap (finish_reason "length")."""
    if isinstance(choice.get("message"), dict):
        choice["message"] = {**choice["message"], "content": text}
    else:
        choice["text"] = text
    choice["finish_reason"] = "length"
    return orjson.dumps(answer)
