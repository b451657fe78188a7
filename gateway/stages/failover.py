"""Failover: one request's attempts at the tier's replicas, shared by the proxy and the embedding stage.

`failover` tries `ctx.candidates` (ranked by the route and affinity stages) in order: a replica that
fails before answering (`Retry`: connection refused, timeout, 5xx, 429, a malformed answer) is skipped
for the next one, up to `upstream.max_attempts` and while the retry budget lasts. Each attempt holds
a `Lease` on its replica (`leased`): released as failed on `Retry`, as done on any other exit the
attempt does not handle itself. `answered` ends a non-streamed attempt's lease and tells the stages
that wait for the first byte (the admission limiter).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import structlog

from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.upstream import Retry
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.errors import GatewayError, Overloaded, UpstreamError
from gateway.metrics import GatewayMetrics

T = TypeVar("T")

log = structlog.get_logger("gateway.proxy")


async def failover(ctx: RequestContext, pool: ReplicaPool, metrics: GatewayMetrics,
                   attempt: Callable[[Replica], Awaitable[T]]) -> T:
    """The first answer of `attempt` over the candidates; the last replica's error when none answered."""
    settings = ctx.config.routes.upstream
    if not ctx.candidates and ctx.tier is not None:
        ctx.error = "no_replica_available"
        wait_s = pool.retry_in(ctx.tier, ctx.config.routes.balancing.health_interval_s)
        raise Overloaded(f"no replica of tier {ctx.tier.name!r} is available (circuit open or failing health "
                         "checks)", code="no_replica_available", retry_after=wait_s)
    budget = pool.retries
    budget.on_request()
    last: GatewayError = UpstreamError("the tier has no replica to try")
    for replica in ctx.candidates[: settings.max_attempts]:
        if ctx.attempts and not budget.try_retry(ctx.config.routes.balancing.retry_budget):
            metrics.retries.labels("budget_exhausted").inc()
            log.warning("retry_budget_exhausted", request_id=ctx.request_id, backend=replica.name)
            break
        if ctx.attempts:
            metrics.retries.labels("sent").inc()
        ctx.attempts += 1
        ctx.replica = replica
        try:
            return await attempt(replica)
        except Retry as retry:
            last = retry.error
            metrics.upstream_failures.labels(replica.name).inc()
            log.warning("upstream_attempt_failed", request_id=ctx.request_id, backend=replica.name,
                        attempt=ctx.attempts, reason=retry.error.message)
    ctx.error = last.code or last.type
    raise last


def lease(ctx: RequestContext, pool: ReplicaPool, replica: Replica, tokens: int | None = None) -> Lease:
    """A hold on `replica` for an attempt at a prompt of `tokens` (the request's estimate unless told),
    counting the part of it warm in the replica's prefix cache."""
    assert ctx.tier is not None
    tokens = ctx.prompt_tokens_est if tokens is None else tokens
    cached = min(tokens, ctx.prefix_tokens) if ctx.prefix_replica == replica.name else 0
    return Lease(pool, replica, ctx.tier, tokens, cached, ctx.config.routes.balancing)


@contextmanager
def leased(held: Lease) -> Iterator[Lease]:
    """Release `held` when the attempt ends in an exception: as the replica's failure on `Retry`."""
    try:
        yield held
    except Retry:
        held.release(failed=True)
        raise
    except BaseException:
        held.release()
        raise


def answered(ctx: RequestContext, held: Lease, completion: int = 0, decode_s: float | None = None) -> None:
    """A non-streamed answer arrived whole: end the lease and tell the stages waiting for the first byte.
    Its first token came `decode_s` before the end when known (the server's own timings; 0 for an answer
    that is all first token, an embedding), else it is estimated from `completion` output tokens."""
    held.release(completion=completion, decode_s=decode_s)
    first_byte(ctx, None, held.first_at)


def first_byte(ctx: RequestContext, held: Lease | None, at: float | None = None) -> None:
    """The upstream answered: tell the lease (the replica's TTFT) and the stages that asked."""
    now = at or time.perf_counter()
    if held is not None:
        held.first_byte(now)
    for hook in ctx.first_byte_hooks:
        hook(now)
