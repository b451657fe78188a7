"""Admission parts called directly: the gradient limit, the priority queue, the tier gate."""

import asyncio

import pytest

from gateway.admission.gate import TierGate
from gateway.admission.gradient import GradientLimit
from gateway.admission.queue import Waiter, WaitQueue
from gateway.config.routes import Admission
from gateway.errors import Overloaded
from gateway.metrics import GatewayMetrics

SETTINGS = Admission(initial_limit=20, min_limit=2, max_limit=100, ttft_target_ms=300)


def test_the_limit_falls_when_ttft_rises_and_climbs_back_when_it_recovers() -> None:
    limit = GradientLimit(SETTINGS.initial_limit)
    for _ in range(100):
        limit.on_sample(0.05, in_flight=int(limit.limit), settings=SETTINGS)
    steady = limit.limit
    assert steady > SETTINGS.initial_limit  # fast and fully used: it grows
    for _ in range(30):
        limit.on_sample(0.9, in_flight=int(limit.limit), settings=SETTINGS)
    slowed = limit.limit
    assert slowed < steady / 4
    for _ in range(200):
        limit.on_sample(0.05, in_flight=int(limit.limit), settings=SETTINGS)
    assert limit.limit > slowed * 4


def test_an_unused_limit_does_not_grow() -> None:
    limit = GradientLimit(SETTINGS.initial_limit)
    for _ in range(100):
        limit.on_sample(0.05, in_flight=2, settings=SETTINGS)
    assert limit.limit == SETTINGS.initial_limit


def waiter(tenant: str, priority: str = "interactive") -> Waiter:
    return Waiter(tenant, priority, asyncio.get_event_loop().create_future())  # type: ignore[arg-type]


async def test_interactive_leaves_first_and_tenants_take_turns() -> None:
    queue = WaitQueue()
    order = [waiter("a"), waiter("a"), waiter("a"), waiter("b"), waiter("batch", "batch"), waiter("c")]
    for w in order:
        queue.push(w)
    popped = [queue.pop(batch_share=0.0) for _ in range(len(order))]
    assert [w.tenant for w in popped if w] == ["a", "b", "c", "a", "a", "batch"]
    assert queue.pop(0.0) is None and len(queue) == 0


async def test_batch_gets_its_share_while_interactive_waits() -> None:
    queue = WaitQueue()
    for _ in range(8):
        queue.push(waiter("i"))
    for _ in range(2):
        queue.push(waiter("b", "batch"))
    popped = [queue.pop(batch_share=0.25) for _ in range(10)]
    assert [w.priority for w in popped if w].index("batch") == 3  # the 4th grant


async def test_a_request_waits_for_a_slot_and_gives_up_at_its_deadline() -> None:
    gate = TierGate("t", Admission(initial_limit=1, min_limit=1, max_limit=4, max_queue=1), GatewayMetrics())
    first = await gate.acquire("a", "interactive", 1.0)
    second = asyncio.create_task(gate.acquire("b", "interactive", 1.0))
    await asyncio.sleep(0.01)
    with pytest.raises(Overloaded) as full:
        await gate.acquire("c", "interactive", 1.0)
    assert full.value.code == "queue_full" and full.value.status == 503
    first.release()
    permit = await asyncio.wait_for(second, 1.0)
    assert permit.waited_s >= 0.01 and gate.in_flight == 1
    with pytest.raises(Overloaded) as late:
        await gate.acquire("d", "interactive", 0.05)
    assert late.value.code == "queue_timeout" and late.value.retry_after is not None
    assert len(gate.queue) == 0


async def test_a_client_that_leaves_the_queue_takes_no_slot() -> None:
    gate = TierGate("t", Admission(initial_limit=1, min_limit=1, max_limit=4), GatewayMetrics())
    held = await gate.acquire("a", "interactive", 1.0)
    leaving = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await asyncio.sleep(0.01)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    held.release()
    assert gate.in_flight == 0 and len(gate.queue) == 0
    assert gate.has_room()


async def test_the_gate_never_admits_more_than_the_backends_batch_slots() -> None:
    gate = TierGate("t", Admission(initial_limit=32, min_limit=2, max_limit=64), GatewayMetrics())
    gate.capacity = 2
    permits = [await gate.acquire("a", "interactive", 1.0) for _ in range(2)]
    assert not gate.has_room() and gate.expected_wait("interactive") > 0
    with pytest.raises(Overloaded):
        await gate.acquire("a", "interactive", 0.01)
    permits[0].release()
    assert gate.has_room()


def test_millisecond_jitter_on_a_fast_backend_does_not_throttle_it() -> None:
    limit = GradientLimit(SETTINGS.initial_limit)
    for i in range(300):  # 12 ms TTFT, now and then 150 ms for a few requests; 3 in flight
        limit.on_sample(0.15 if i % 40 < 8 else 0.012, in_flight=3, settings=SETTINGS)
    assert limit.limit >= SETTINGS.initial_limit


async def test_the_queue_length_counts_every_class_through_push_pop_and_remove() -> None:
    queue = WaitQueue()
    first, batch, last = waiter("a"), waiter("b", "batch"), waiter("c")
    for w in (first, batch, last):
        queue.push(w)
    assert (len(queue), queue.depth("interactive"), queue.depth("batch"), queue.ahead_of("batch")) == (3, 2, 1, 3)
    assert queue.remove(batch) and not queue.remove(batch)  # a second remove finds nothing
    assert (len(queue), queue.ahead_of("batch")) == (2, 2)
    assert queue.pop(0.0) is first and len(queue) == 1
    assert queue.remove(last) and len(queue) == 0 and queue.pop(0.0) is None
