"""TierGate: one tier's adaptive concurrency limit and its waiting room; a Permit is one admitted request."""

from __future__ import annotations

import asyncio
import time

from gateway.admission.gradient import GradientLimit
from gateway.admission.queue import PRIORITIES, Waiter, WaitQueue
from gateway.backends.stats import ewma
from gateway.config.policies import Priority
from gateway.config.routes import Admission
from gateway.errors import Overloaded
from gateway.metrics import GatewayMetrics

HOLD_ALPHA = 0.1
DEFAULT_HOLD_S = 1.0


class TierGate:
    def __init__(self, tier: str, settings: Admission, metrics: GatewayMetrics) -> None:
        self.tier = tier
        self.settings = settings  # replaced on config reload; the learned limit stays
        self.limiter = GradientLimit(settings.initial_limit)
        self.in_flight = 0
        self.queue = WaitQueue()
        self.hold_s: float | None = None  # EWMA of how long an admitted request holds its slot
        self.capacity: int | None = None  # the tier's batch slots, when known: the limit never exceeds them
        self._limit_gauge = metrics.admission_limit.labels(tier)
        self._in_flight_gauge = metrics.admission_in_flight.labels(tier)
        self._depth_gauges = {p: metrics.queue_depth.labels(tier, p) for p in PRIORITIES}
        self._wait = metrics.queue_wait.labels(tier)
        self._limit_gauge.set(self.limiter.limit)

    @property
    def slots(self) -> int:
        """Requests admitted at once: the adaptive limit, at most the backends' batch slots (above
        them a request only waits in a backend's queue, where nothing orders it or keeps its deadline)."""
        slots, capacity = self.limiter.slots, self.capacity
        return capacity if capacity is not None and capacity < slots else slots

    def has_room(self) -> bool:
        return not self.queue and self.in_flight < self.slots

    def expected_wait(self, priority: Priority) -> float:
        """Seconds a request of `priority` arriving now would wait for a slot: a slot frees about every
        hold / limit seconds, and those ahead of it take the first ones."""
        if self.has_room():
            return 0.0
        ahead = self.queue.ahead_of(priority) + max(0, self.in_flight - self.slots + 1)
        return (ahead + 1) * (self.hold_s or DEFAULT_HOLD_S) / self.slots

    async def acquire(self, tenant: str, priority: Priority, max_wait_s: float) -> Permit:
        """A slot now, or after waiting at most `max_wait_s`; Overloaded (503) when the queue is full
        or the wait runs out."""
        if self.has_room():
            return self._grant(0.0)
        if len(self.queue) >= self.settings.max_queue:
            raise Overloaded(f"tier {self.tier!r} is at capacity and its queue is full", code="queue_full",
                             retry_after=self.expected_wait(priority))
        loop = asyncio.get_running_loop()
        waiter = Waiter(tenant, priority, loop.create_future(), time.perf_counter())
        self.queue.push(waiter)
        self._depth_gauges[priority].inc()
        timer = loop.call_later(max(0.0, max_wait_s), self._expire, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self._free()  # granted in the same instant the client left
            elif self.queue.remove(waiter):
                self._depth_gauges[priority].dec()
            raise
        finally:
            timer.cancel()
        return Permit(self, time.perf_counter() - waiter.enqueued_at)

    def _expire(self, waiter: Waiter) -> None:
        if self.queue.remove(waiter):
            self._depth_gauges[waiter.priority].dec()
            waited = time.perf_counter() - waiter.enqueued_at
            waiter.future.set_exception(Overloaded(
                f"tier {self.tier!r} is at capacity: no slot freed within {waited * 1000:.0f} ms",
                code="queue_timeout", retry_after=self.expected_wait(waiter.priority)))

    def _grant(self, waited_s: float) -> Permit:
        self.in_flight += 1
        self._in_flight_gauge.set(self.in_flight)
        return Permit(self, waited_s)

    def _free(self) -> None:
        self.in_flight -= 1
        self._in_flight_gauge.set(self.in_flight)
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        """Hand free slots to waiters, in the queue's order."""
        while self.queue and self.in_flight < self.slots:
            waiter = self.queue.pop(self.settings.batch_share)
            if waiter is None:
                return
            self._depth_gauges[waiter.priority].dec()
            if waiter.future.done():
                continue  # its client left; the cancel path found it already out of the queue
            self.in_flight += 1
            self._in_flight_gauge.set(self.in_flight)
            waiter.future.set_result(None)

    def on_sample(self, ttft_s: float) -> None:
        self.limiter.on_sample(ttft_s, self.in_flight, self.settings)
        self._limit_gauge.set(min(self.limiter.limit, self.capacity or self.limiter.limit))
        self._admit_waiters()

    def on_release(self, held_s: float) -> None:
        self.hold_s = ewma(self.hold_s, held_s, HOLD_ALPHA)
        self._free()


class Permit:
    """One admitted request's slot: `sample` feeds the limiter its TTFT, `release` frees the slot (once)."""

    __slots__ = ("_gate", "waited_s", "granted_at", "_sampled", "_held")

    def __init__(self, gate: TierGate, waited_s: float) -> None:
        self._gate = gate
        self.waited_s = waited_s
        self.granted_at = time.perf_counter()
        self._sampled = False
        self._held = True
        gate._wait.observe(waited_s)

    def sample(self, first_byte_at: float) -> None:
        if not self._sampled and self._held:
            self._sampled = True
            self._gate.on_sample(first_byte_at - self.granted_at)

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate.on_release(time.perf_counter() - self.granted_at)
