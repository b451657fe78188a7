"""Proxy: send the request to the tier's replicas in rank order until one answers, then relay it.

A replica that fails before the first byte (connection refused, timeout, 5xx, 429) is skipped for
the next one, up to `upstream.max_attempts` and while the retry budget lasts (`stages.failover`);
after the first byte the relay owns the stream, and a stream that breaks goes on from another replica
(`stages.resume`). The first byte's time feeds the replica's TTFT statistics and the hooks of other stages
(the admission limiter).

The tenant's output cap holds for every output (prompts x n): a stream is cut per choice index
(`gateway.sse`), a whole answer has each choice cut to the character cap (`_trim_answer`); the backend's
max_tokens is already the token cap (policy). A client that leaves before the answer came (a non-streamed
request, or a stream before its first byte) leaves work behind: the backend had the prompt and decoded
for a while. The attempt is cancelled at once (the backend stops) and priced (`price_abandoned`): the
prompt as the tier's tokenizer counts it (accounting), and the output the replica's measured decode
rate gives for the time it ran (`priced_from` in the log line says which).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.backends.h1 import Response, UpstreamClient
from gateway.backends.idle import IdleWatchdog
from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.relay import SseRelay
from gateway.backends.stats import ReplicaStats, server_decode_s
from gateway.backends.upstream import Retry, post, read_answer
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.errors import UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.protocols.anthropic import wants_stop_word
from gateway.protocols.native import ResponsesScanner, is_native, settle as settle_native, upstream_body as native_body
from gateway.sse import OutputLimit, SseScanner
from gateway.stages.answer import ContextSink, apply_usage, outputs
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
        sent_at = time.perf_counter()
        try:
            response = await self._post(ctx, replica)
            ctx.upstream_started = True
            if not ctx.stream:
                reply, decode_s = await _settle_json(ctx, response, replica)
                answered(ctx, held, (ctx.completion_tokens or 0) // outputs(ctx)[1], decode_s)  # per output: the TPOT
                return reply
            first = await first_bytes(response, replica)
            first_byte(ctx, held)
            return StreamReply(self._relay(ctx, response, first, held))
        except BaseException as err:
            if response is not None:
                response.close()  # a no-op once read whole
            held.release(failed=isinstance(err, Retry))  # a no-op once answered
            if isinstance(err, asyncio.CancelledError) and ctx.usage_source is None:  # the client left
                price_abandoned(ctx, self._pool.state(replica), time.perf_counter() - sent_at)
            raise

    def _relay(self, ctx: RequestContext, response: Response, first: bytes, held: Lease) -> SseRelay:
        """The relay that takes over `response` and `held` from the attempt."""
        cap = ctx.tenant.output_cap if ctx.tenant else None
        limit = OutputLimit(cap.tokens, cap.chars) if cap else None
        resumer = None if is_native(ctx) else self.resumes.for_request(ctx, held)  # it needs the text sent
        scanner = (ResponsesScanner if is_native(ctx) else SseScanner)(
            ctx.endpoint, forward_usage=ctx.client_wants_usage,
            collect_text=ctx.cache_key is not None or ctx.keep_text or resumer is not None, limit=limit,
            outputs=outputs(ctx)[0])
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
            return _settle_native(ctx, answer, data), None
        choices = answer["choices"]
        choice = choices[0]
        if not isinstance(choice, dict) or not all(isinstance(c, dict) for c in choices):
            raise TypeError("a choice is not an object")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise Retry(UpstreamError(f"backend {replica.name} sent a malformed answer")) from None
    apply_usage(ctx, answer.get("usage"))  # the backend's own counts: the tokens it wrote, cut or not
    cap = ctx.tenant.output_cap.chars if ctx.tenant and ctx.tenant.output_cap else None
    if cap is not None and _trim_answer(choices, cap):
        data, ctx.output_capped = orjson.dumps(answer), True
    ctx.finish_reason = choice.get("finish_reason")
    ctx.response_text = _text_of(choice)
    return JsonReply(200, data), server_decode_s(answer)


def _settle_native(ctx: RequestContext, answer: Any, data: bytes) -> JsonReply:
    """A Responses answer (one output) as its tier sent it, its text cut to the tenant's character cap:
    status "incomplete" (max_output_tokens), as when the backend stops at the token cap."""
    ctx.response_text = settle_native(ctx, answer)
    cap = ctx.tenant.output_cap.chars if ctx.tenant and ctx.tenant.output_cap else None
    if cap is None or ctx.response_text is None or len(ctx.response_text) <= cap:
        return JsonReply(200, data)
    left = cap
    for item in answer.get("output") or ():
        for part in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                part["text"] = part["text"][:left]
                left -= len(part["text"])
    answer["status"], answer["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    ctx.response_text, ctx.finish_reason, ctx.output_capped = ctx.response_text[:cap], "length", True
    return JsonReply(200, orjson.dumps(answer))


def _text_of(choice: dict[str, Any]) -> str | None:
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def _trim_answer(choices: list[dict[str, Any]], cap: int) -> bool:
    """Cut every choice's text to the tenant's character cap (finish_reason "length"); whether any was cut."""
    cut = False
    for choice in choices:
        text = _text_of(choice)
        if text is None or len(text) <= cap:
            continue
        if isinstance(choice.get("message"), dict):
            choice["message"] = {**choice["message"], "content": text[:cap]}
        else:
            choice["text"] = text[:cap]
        choice["finish_reason"] = "length"
        cut = True
    return cut


def price_abandoned(ctx: RequestContext, stats: ReplicaStats, elapsed_s: float) -> None:
    """A client left an attempt before its answer came, `elapsed_s` after it was sent: the backend had read
    the prompt (accounting counts it with the tier's tokenizer) and wrote, per output, about one token at
    its first-token time and one more each TPOT since (the replica's measured decode rate), up to
    max_tokens. No measured rate: the prompt only. A stream (the relay did not take it over yet) had
    sent no byte: it wrote nothing yet (its first token is sent as soon as it is made)."""
    ctx.completion_tokens = 0
    ctx.priced_from = "prompt_only"  # the backend had the request: its work is priced (accounting)
    if ctx.stream:
        return
    tpot = stats.tpot_s
    if tpot is None or tpot <= 0:
        return
    ttft = ctx.predicted_ttft_s if ctx.predicted_ttft_s is not None and ctx.attempts == 1 else stats.ttft_s
    decoding = elapsed_s - (ttft or 0.0)
    if decoding < 0:
        per_output = 0
    else:
        per_output = 1 + int(decoding / tpot)
        if ctx.max_tokens is not None:
            per_output = min(per_output, ctx.max_tokens)
    ctx.completion_tokens = per_output * outputs(ctx)[1]
    ctx.priced_from = "estimated_decode_rate"
