"""RedisGuard: every Redis call of the request path goes through `run`, which never raises.

A connection error, or `timeouts_to_down` timeouts in a row lasting `down_after_s` with no success
between them (a reply that arrives after its call gave up counts as a success: Redis is slow, not
down), returns None and marks Redis down for `down_backoff_s`: calls in that window return
None at once (no connect-timeout tax per request), then a single probe call goes through; its
success marks Redis up again. A timeout alone only returns None: the budget is measured from the
event loop, so one stall times out every call pending at that moment, and that is not an outage.
Calls are shielded: giving up on a reply does not cancel the read (which would drop the
connection). Other errors (a bad command, a wrong type) return None too but leave Redis up. Metrics: `gateway_redis_up`, `gateway_redis_errors_total{op}`,
`gateway_redis_op_seconds{op}`; logs: `redis_unavailable` (at most one per `warn_every_s`),
`redis_recovered`, `redis_op_failed` (rate-limited the same way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.cache.connection import RedisClient

T = TypeVar("T")
OP_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)  # up to the limiter's 2 s
UNAVAILABLE = (RedisConnectionError, OSError)

log = structlog.get_logger("gateway.redis")


class RedisGuard:
    """Runs Redis operations with a short timeout; skips them while Redis is known to be down."""

    def __init__(
        self, client: RedisClient, *, op_timeout_s: float = 0.005, down_backoff_s: float = 1.0,
        registry: CollectorRegistry | None = None, warn_every_s: float = 10.0, timeouts_to_down: int = 3,
        down_after_s: float = 0.25,
    ) -> None:
        self.client = client
        self.op_timeout_s = op_timeout_s
        self.down_backoff_s = down_backoff_s
        self.warn_every_s = warn_every_s
        self.timeouts_to_down = timeouts_to_down
        self.down_after_s = down_after_s
        self._timeouts = 0  # in a row
        self._first_timeout_at = 0.0
        self.registry = registry if registry is not None else CollectorRegistry()
        self._up = True
        self._retry_at = 0.0  # while down: when the next probe may go
        self._probing = False
        self._last_warning: dict[str, float] = {}
        self._up_gauge = Gauge("gateway_redis_up", "1 when Redis answers, 0 while it is skipped",
                               registry=self.registry)
        self._up_gauge.set(1)
        self._errors = Counter("gateway_redis_errors", "Redis operations that failed or timed out", ("op",),
                               registry=self.registry)
        self._seconds = Histogram("gateway_redis_op_seconds", "Redis operation latency (successful ones)",
                                  ("op",), buckets=OP_BUCKETS, registry=self.registry)
        self._children: dict[str, tuple[Histogram, Counter]] = {}

    @property
    def up(self) -> bool:
        return self._up

    def _metrics(self, op: str) -> tuple[Histogram, Counter]:
        pair = self._children.get(op)
        if pair is None:
            pair = self._children[op] = (self._seconds.labels(op), self._errors.labels(op))
        return pair

    async def run(self, op: str, call: Callable[[], Awaitable[T]], timeout_s: float | None = None) -> T | None:
        """`await call()` within the timeout; None if Redis is down, slow or the call failed."""
        probe = False
        if not self._up:
            if self._probing or time.monotonic() < self._retry_at:
                return None
            self._probing = probe = True
        seconds, errors = self._metrics(op)
        start = time.perf_counter()
        reply: asyncio.Future[T] | None = None
        try:
            # shielded: giving up on a slow reply must not cancel the read, which would drop the
            # connection and make the next call pay for a reconnect inside its own budget
            reply = asyncio.ensure_future(call())
            result = await asyncio.wait_for(asyncio.shield(reply), timeout_s or self.op_timeout_s)
        except (TimeoutError, RedisTimeoutError) as err:
            errors.inc()
            if reply is not None and not reply.done():  # the reply may still come
                reply.add_done_callback(self._late_reply)
            if self._timeouts == 0:
                self._first_timeout_at = time.monotonic()
            self._timeouts += 1
            # one event-loop stall times out every call pending at that moment: Redis is marked down
            # only when timeouts go on for `down_after_s` with no success in between
            lasting = time.monotonic() - self._first_timeout_at >= self.down_after_s
            if probe or (self._timeouts >= self.timeouts_to_down and lasting):
                self._mark_down(op, err)
            return None
        except UNAVAILABLE as err:
            errors.inc()
            self._mark_down(op, err)
            return None
        except Exception as err:  # never raise to the request path
            errors.inc()
            self._warn("redis_op_failed", op, err)
            if probe:  # it answered, so it is up
                self._mark_up()
            return None
        finally:
            if probe:
                self._probing = False
        seconds.observe(time.perf_counter() - start)
        self._timeouts = 0
        if not self._up:
            self._mark_up()
        return result

    def _late_reply(self, reply: asyncio.Future[Any]) -> None:
        """A reply that came after its call gave up: Redis is slow, not gone, so the timeouts in a row
        so far do not count towards marking it down."""
        if not reply.cancelled() and reply.exception() is None:
            self._timeouts = 0

    def _mark_down(self, op: str, err: BaseException) -> None:
        self._retry_at = time.monotonic() + self.down_backoff_s
        if self._up:
            self._up = False
            self._up_gauge.set(0)
        self._warn("redis_unavailable", op, err)

    def _mark_up(self) -> None:
        self._up = True
        self._up_gauge.set(1)
        log.info("redis_recovered")

    def _warn(self, event: str, op: str, err: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_warning.get(event, -self.warn_every_s) >= self.warn_every_s:
            self._last_warning[event] = now
            log.warning(event, op=op, error=f"{type(err).__name__}: {err}")
