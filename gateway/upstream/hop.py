"""The hop to a replica for chat and completions (and Responses on a tier serving it natively): the request's
attempts in rank order until one answers (`failover`), then its answer, whole or relayed.

Each try is an `Attempt`, which owns the replica's lease and the upstream response until the relay takes both
over (`SseRelay.close`, through `ContextSink.closed`). A stream that breaks after its first byte goes on from
another replica (`gateway.upstream.resume`): a second attempt through the same code. The first byte's time
feeds the replica's TTFT statistics and the hooks of other stages (the admission limiter).

The tenant's output cap holds for every output (prompts x n): a stream is cut per choice index
(`gateway.sse`), a whole answer has each choice cut to the character cap (`gateway.upstream.settle`); the
backend's max_tokens is already the token cap (policy). A client that leaves before the answer came (a
non-streamed request, or a stream before its first byte) leaves work behind: the attempt is cancelled at once
(the backend stops) and priced (`price_abandoned`).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from gateway.backends.h1 import UpstreamClient
from gateway.backends.idle import IdleWatchdog
from gateway.backends.pool import ReplicaPool
from gateway.backends.relay import SseRelay
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.keyspace import cache_salt
from gateway.metrics import GatewayMetrics
from gateway.protocols.anthropic import wants_stop_word
from gateway.protocols.native import ResponsesScanner, is_native, upstream_body as native_body
from gateway.routing.escalate import armed, ask_logprobs, client_asked
from gateway.sse import OutputLimit, SseScanner
from gateway.tokens import TokenCounters
from gateway.types import Reply, StreamReply
from gateway.upstream.attempt import PATHS, Attempt, failover
from gateway.upstream.held import HoldScanner
from gateway.upstream.resume import StreamResumes
from gateway.upstream.settle import settle_json
from gateway.upstream.sink import ContextSink, outputs, price_abandoned


class UpstreamHop:
    """The app's hop to its replicas: the upstream client, the pool, the idle watchdog, resuming."""

    def __init__(
        self, client: UpstreamClient, pool: ReplicaPool, watchdog: IdleWatchdog, metrics: GatewayMetrics,
        count_tokens: Callable[[RequestContext], None], counters: TokenCounters | None = None,
    ) -> None:
        self._client = client
        self._pool = pool
        self._watchdog = watchdog
        self._metrics = metrics
        self._count_tokens = count_tokens  # the account stage's counts, for a usage chunk the backend left out
        # a broken stream goes on elsewhere
        self.resumes = StreamResumes(client, pool, metrics, count_tokens, counters or TokenCounters())

    def answer(self, ctx: RequestContext) -> Coroutine[Any, Any, Reply]:
        """The answer of the first of the request's candidates that gives one (`failover`'s coroutine itself)."""
        return failover(ctx, self._pool, self._metrics, partial(self._attempt, ctx))

    async def _attempt(self, ctx: RequestContext, replica: Replica) -> Reply:
        """One replica's try (see `Attempt`); a client that leaves before the answer came leaves work, priced."""
        attempt = Attempt(ctx, self._pool, replica)
        try:
            with attempt:
                response = await attempt.post(self._client, "/responses" if is_native(ctx) else PATHS[ctx.endpoint],
                                              orjson.dumps(self._body(ctx, replica)))
                ctx.upstream.upstream_started = True
                if not ctx.stream:
                    reply, decode_s = await settle_json(ctx, response, replica)
                    attempt.answered((ctx.upstream.completion_tokens or 0) // outputs(ctx)[1], decode_s)  # per output: TPOT
                    return reply
                first = await attempt.first_bytes()
                return StreamReply(self._relay(ctx, attempt, first))
        except asyncio.CancelledError:
            if ctx.upstream.usage_source is None:  # the client left
                price_abandoned(ctx, self._pool.state(replica), time.perf_counter() - attempt.sent_at)
            raise

    def _relay(self, ctx: RequestContext, attempt: Attempt, first: bytes) -> SseRelay:
        """The relay that takes over the attempt's response and lease."""
        cap = ctx.tenant.output_cap if ctx.tenant else None
        limit = OutputLimit(cap.tokens, cap.chars) if cap else None
        resumer = None if is_native(ctx) else self.resumes.for_request(ctx, attempt.lease)  # it needs the text
        collect = ctx.cache_key is not None or ctx.keep_text or resumer is not None
        scanner: SseScanner
        if armed(ctx) is not None:  # held for its first tokens' confidence (escalate.hold_tokens)
            ctx.upstream.held_logprobs = []
            scanner = HoldScanner(ctx.endpoint, forward_usage=ctx.client_wants_usage, collect_text=collect,
                                  limit=limit, outputs=outputs(ctx)[0], logprobs=ctx.upstream.held_logprobs,
                                  strip=not client_asked(ctx.endpoint, ctx.body))
        else:
            scanner = (ResponsesScanner if is_native(ctx) else SseScanner)(
                ctx.endpoint, forward_usage=ctx.client_wants_usage, collect_text=collect, limit=limit,
                outputs=outputs(ctx)[0])
        response, lease = attempt.hand_over()
        sink = ContextSink(ctx, lease, self._count_tokens)
        idle_s = ctx.config.routes.upstream.read_timeout_s
        return SseRelay(response, scanner, first, sink, self._watchdog, idle_s, max_tokens=ctx.max_tokens,
                        wants_usage=ctx.client_wants_usage, resumer=resumer)

    @staticmethod
    def _body(ctx: RequestContext, replica: Replica) -> dict[str, Any]:
        """What the replica is sent: the client's body under the replica's model name (never a client header:
        only the replica's own key from config goes upstream, `backends.upstream.post`)."""
        native = is_native(ctx)  # a Responses request to a tier serving /responses itself
        body: dict[str, Any] = native_body(ctx, replica.model) if native else {**ctx.body, "model": replica.model}
        if not native and "max_completion_tokens" in body:  # llama-cpp-python reads only max_tokens: without
            body["max_tokens"] = body["max_completion_tokens"]  # it, a limit asked that way was ignored
        if ctx.stream and not native:
            body["stream_options"] = {"include_usage": True}
        if armed(ctx) is not None:  # the answer's confidence decides whether it escalates (gateway.upstream.escalate)
            body = ask_logprobs(ctx.endpoint, body)
        if wants_stop_word(ctx, replica):  # llama.cpp names the stop sequence that matched only when asked
            body["verbose"] = True
        if replica.prefix_cache_salt:  # vLLM's prefix cache per tenant scope, over any salt the client sent
            body["cache_salt"] = cache_salt(ctx.tenant)
        return body
