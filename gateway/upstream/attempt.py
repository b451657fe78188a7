"""One try at one replica, and the order of tries: the single owner of a replica's lease from pick to release.

    attempt = Attempt(ctx, pool, replica)              # the lease: the replica counts it in flight
    with attempt:                                      # an exception: response closed, lease released (once)
        response = await attempt.post(client, path, body)
        first = await attempt.first_bytes()            # the replica's TTFT; the stages waiting for it told
    relay = SseRelay(*attempt.hand_over(), ...)        # ... or attempt.answered(completion, decode_s)

`failover` runs a request's first answer over the ranked candidates: a replica that fails before answering
(`Retry`: connection refused, timeout, 5xx, 429, a malformed answer) is skipped for the next one, up to
`upstream.max_attempts`. Every try after the first takes one retry from the pool's budget (`may_try`): the
failover's, and a broken stream's continuation (gateway.upstream.resume), which is a second attempt through
this same code. Chat, completions, embeddings and resume alike.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TypeVar

import structlog

from gateway.backends.h1 import ClientFailure, Response, UpstreamClient
from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.upstream import Retry, post
from gateway.config import Replica, Tier
from gateway.context import RequestContext
from gateway.errors import GatewayError, Overloaded, UpstreamError, UpstreamTimeout
from gateway.metrics import GatewayMetrics

T = TypeVar("T")

PATHS = {"chat": "/chat/completions", "completions": "/completions"}  # where each endpoint's requests go

log = structlog.get_logger("gateway.proxy")


class Attempt:
    """One request's try at one replica: holds the replica's `Lease` from the pick to its release, and the
    upstream response until a relay takes both over (`hand_over`). Used as a context manager: an exception
    inside closes the response and releases the lease (as the replica's failure on `Retry`); releasing twice
    is a no-op, so a lease `answered` or handed over is left alone."""

    __slots__ = ("ctx", "replica", "lease", "response", "sent_at", "_first")

    def __init__(self, ctx: RequestContext, pool: ReplicaPool, replica: Replica, *, tier: Tier | None = None,
                 tokens: int | None = None, first: bool = True) -> None:
        """`tokens`: the prompt's length (the request's estimate unless told), the part of it warm in the
        replica's prefix cache counted; `tier`: the replica's (the request's unless told); `first`: the
        request's first answer (its first byte tells the stages that wait for it), not a continuation."""
        route = ctx.route
        tier = tier or route.tier
        assert tier is not None
        tokens = ctx.prompt_tokens_est if tokens is None else tokens
        warm = first and route.prefix_replica == replica.name
        cached = min(tokens, route.prefix_tokens) if warm else 0
        # admission predicted this very pick a moment ago (the same replica and prompt, the state unchanged: the
        # request's first try, nothing awaited since but a queue wait, after which admission predicts again)
        known = route.predicted_ttft_s if (
            first and ctx.upstream.attempts == 1 and replica is route.predicted_on and tokens == ctx.prompt_tokens_est
            and cached == (route.prefix_tokens if warm else 0)) else None
        self.ctx = ctx
        self.replica = replica
        self.lease = Lease(pool, replica, tier, tokens, cached, ctx.config.routes.balancing, known)
        self.response: Response | None = None
        self.sent_at = time.perf_counter()
        self._first = first

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:
        if err is None:
            return
        if self.response is not None:
            self.response.close()  # a no-op once read whole
        self.lease.release(failed=isinstance(err, Retry))  # a no-op once answered

    async def post(self, client: UpstreamClient, path: str, body: bytes,
                   replica: Replica | None = None) -> Response:
        """POST `body` to the replica (`replica`: the same server under another base URL); a 200, or raises."""
        ctx = self.ctx
        self.response = await post(client, replica or self.replica, path, body, ctx.config.routes.upstream,
                                   ctx.trace.headers() if ctx.trace is not None else None)
        return self.response

    async def first_bytes(self) -> bytes:
        """The first bytes of a streamed answer (`Retry` when none came in time); marks the first byte."""
        assert self.response is not None
        replica = self.replica
        try:
            first = await self.response.readany()
        except TimeoutError:
            raise Retry(UpstreamTimeout(f"backend {replica.name} sent no first byte in time")) from None
        except ClientFailure as err:
            raise Retry(UpstreamError(f"backend {replica.name} failed before the first byte: {err}")) from None
        if not first:
            raise Retry(UpstreamError(f"backend {replica.name} closed the stream before the first byte"))
        self.first_byte()
        return first

    def first_byte(self, at: float | None = None) -> None:
        """The replica started answering: its TTFT; a first answer also tells the stages that asked."""
        now = at or time.perf_counter()
        self.lease.first_byte(now)
        if self._first:
            for hook in self.ctx.first_byte_hooks:
                hook(now)

    def answered(self, completion: int = 0, decode_s: float | None = None) -> None:
        """A non-streamed answer arrived whole: end the lease, and tell the stages waiting for the first byte.
        Its first token came `decode_s` before the end when known (the server's own timings; 0 for an answer
        that is all first token, an embedding), else it is estimated from `completion` output tokens."""
        self.lease.release(completion=completion, decode_s=decode_s)
        if self._first:
            now = self.lease.first_at or time.perf_counter()
            for hook in self.ctx.first_byte_hooks:
                hook(now)

    def hand_over(self) -> tuple[Response, Lease]:
        """The response and the lease, for the relay that owns them from here (`SseRelay.close` ends both)."""
        assert self.response is not None
        return self.response, self.lease


def may_try(ctx: RequestContext, pool: ReplicaPool, metrics: GatewayMetrics, replica: Replica) -> bool:
    """Whether the request may try `replica` now: its first try may, each later one (failover, a stream's
    continuation) takes one retry from the budget. Counts the try."""
    if ctx.upstream.attempts:
        if not pool.retries.try_retry(ctx.config.routes.balancing.retry_budget):
            metrics.retries.labels("budget_exhausted").inc()
            log.warning("retry_budget_exhausted", request_id=ctx.request_id, backend=replica.name)
            return False
        metrics.retries.labels("sent").inc()
    ctx.upstream.attempts += 1
    return True


async def failover(ctx: RequestContext, pool: ReplicaPool, metrics: GatewayMetrics,
                   attempt: Callable[[Replica], Awaitable[T]]) -> T:
    """The first answer of `attempt` over the candidates; the last replica's error when none answered."""
    settings = ctx.config.routes.upstream
    if not ctx.route.candidates and ctx.route.tier is not None:
        ctx.result.flag("no_replica_available")
        wait_s = pool.retry_in(ctx.route.tier, ctx.config.routes.balancing.health_interval_s)
        raise Overloaded(f"no replica of tier {ctx.route.tier.name!r} is available (circuit open or failing health "
                         "checks)", code="no_replica_available", retry_after=wait_s)
    pool.retries.on_request()
    last: GatewayError = UpstreamError("the tier has no replica to try")
    for replica in ctx.route.candidates[: settings.max_attempts]:
        if not may_try(ctx, pool, metrics, replica):
            break
        ctx.upstream.replica = replica
        try:
            return await attempt(replica)
        except Retry as retry:
            last = retry.error
            metrics.upstream_failures.labels(replica.name).inc()
            log.warning("upstream_attempt_failed", request_id=ctx.request_id, backend=replica.name,
                        attempt=ctx.upstream.attempts, reason=retry.error.message)
    ctx.result.flag(last.code or last.type)
    raise last

