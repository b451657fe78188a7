"""The tier gate to exact numbers (issue 42: mutants of gateway/admission/gate.py that the admission tests let
survive): the expected wait it quotes (Retry-After), who gets a freed slot and how many are in flight, the
client that leaves while waiting or in the instant it is granted, a permit's one sample and one release,
and the gauges each tier reports."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.admission import gate as gate_module
from gateway.admission.gate import TierGate
from gateway.admission.queue import Waiter
from gateway.config.routes import Admission
from gateway.errors import Overloaded
from gateway.metrics import GatewayMetrics


def make_gate(limit: int = 1, metrics: GatewayMetrics | None = None, **settings: Any) -> TierGate:
    admission = Admission(initial_limit=limit, min_limit=1, max_limit=limit, **settings)
    return TierGate("t", admission, metrics or GatewayMetrics())


def queued(gate: TierGate, tenant: str, priority: str = "interactive") -> Waiter:
    waiter = Waiter(tenant, priority, asyncio.get_running_loop().create_future(), time.perf_counter())  # type: ignore[arg-type]
    gate.queue.push(waiter)
    return waiter


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_expected_wait_is_the_slots_ahead_times_the_hold_over_the_limit() -> None:
    gate = make_gate(2)
    gate.hold_s = 0.5
    assert gate.expected_wait("interactive") == 0.0  # room now
    permits = [await gate.acquire("a", "interactive", 1.0) for _ in range(2)]
    # full, nobody waiting: the next slot is the first to free, in hold / slots
    assert gate.expected_wait("interactive") == pytest.approx(0.5)
    queued(gate, "a", "interactive")
    queued(gate, "b", "batch")
    assert gate.expected_wait("interactive") == pytest.approx(0.75)  # behind one interactive
    assert gate.expected_wait("batch") == pytest.approx(1.0)  # behind both
    gate.in_flight = 4  # the limit fell below what is in flight: those over it must finish first
    gate.queue = type(gate.queue)()
    assert gate.expected_wait("interactive") == pytest.approx(1.0)  # 3 slots to free first, then its own
    gate.hold_s = None  # no release seen yet: a second a request
    assert gate.expected_wait("interactive") == pytest.approx(2.0)
    del permits


async def test_expected_wait_with_waiters_and_free_slots() -> None:
    gate = make_gate(2)
    gate.hold_s = 0.5
    queued(gate, "a")  # waiting although a slot is free (about to be granted): only the queue is ahead
    assert gate.expected_wait("interactive") == pytest.approx(0.5)


async def test_a_full_queue_says_how_long_to_wait() -> None:
    gate = make_gate(1, max_queue=1)
    gate.hold_s = 0.5
    held = await gate.acquire("a", "interactive", 1.0)
    queued(gate, "b", "batch")
    with pytest.raises(Overloaded, match=r"tier 't' is at capacity and its queue is full") as full:
        await gate.acquire("c", "interactive", 1.0)
    assert full.value.code == "queue_full"
    assert full.value.retry_after == pytest.approx(1.0)  # (0 interactive + 1 in flight + 1) * 0.5 / 1
    with pytest.raises(Overloaded) as batch:
        await gate.acquire("c", "batch", 1.0)
    assert batch.value.retry_after == pytest.approx(1.5)  # behind the batch waiter too
    held.release()


async def test_tenants_take_turns_for_freed_slots() -> None:
    gate = make_gate(1)
    held = await gate.acquire("x", "interactive", 1.0)
    order: list[str] = []

    async def wait(tenant: str) -> None:
        permit = await gate.acquire(tenant, "interactive", 5.0)
        order.append(tenant)
        await asyncio.sleep(0)
        permit.release()

    tasks = []
    for tenant in ("a", "a", "b"):
        tasks.append(asyncio.create_task(wait(tenant)))
        await settle()
    held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert order == ["a", "b", "a"]


async def test_batch_gets_its_share_of_freed_slots() -> None:
    gate = make_gate(1, batch_share=0.5)
    held = await gate.acquire("x", "interactive", 1.0)
    order: list[str] = []

    async def wait(name: str, priority: str) -> None:
        permit = await gate.acquire(name, priority, 5.0)  # type: ignore[arg-type]
        order.append(name)
        await asyncio.sleep(0)
        permit.release()

    tasks = []
    for name, priority in (("i1", "interactive"), ("i2", "interactive"), ("b1", "batch")):
        tasks.append(asyncio.create_task(wait(name, priority)))
        await settle()
    held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 5.0)
    assert order == ["i1", "b1", "i2"]  # every second grant to batch while both wait


async def test_a_freed_slot_goes_to_a_waiter_and_keeps_the_count() -> None:
    metrics = GatewayMetrics()
    gate = make_gate(3, metrics)
    permits = [await gate.acquire("a", "interactive", 1.0) for _ in range(3)]
    waiting = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await settle()
    assert gate.in_flight == 3 and len(gate.queue) == 1
    permits[0].release()
    granted = await asyncio.wait_for(waiting, 5.0)
    assert gate.in_flight == 3 and len(gate.queue) == 0
    assert metrics.registry.get_sample_value("gateway_admission_in_flight", {"tier": "t"}) == 3
    granted.release()
    assert metrics.registry.get_sample_value("gateway_admission_in_flight", {"tier": "t"}) == 2


async def test_no_waiter_is_admitted_over_the_limit() -> None:
    gate = make_gate(1)
    held = await gate.acquire("a", "interactive", 1.0)
    waiting = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await settle()
    gate.on_sample(0.01)  # a sample hands free slots to waiters: there is none
    await settle()
    assert gate.in_flight == 1 and len(gate.queue) == 1 and not waiting.done()
    held.release()
    (await asyncio.wait_for(waiting, 5.0)).release()


async def test_a_waiter_that_left_in_the_same_tick_passes_its_slot_on() -> None:
    gate = make_gate(1)
    held = await gate.acquire("a", "interactive", 1.0)
    leaving = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await settle()
    staying = asyncio.create_task(gate.acquire("c", "interactive", 5.0))
    await settle()
    leaving.cancel()  # its future is cancelled now; the task runs its except clause later
    held.release()  # meanwhile the freed slot: "b" is skipped, "c" gets it
    permit = await asyncio.wait_for(staying, 5.0)
    await asyncio.gather(leaving, return_exceptions=True)
    assert gate.in_flight == 1 and len(gate.queue) == 0
    permit.release()
    assert gate.in_flight == 0


async def test_a_client_leaving_the_queue_is_taken_out_at_once() -> None:
    metrics = GatewayMetrics()
    gate = make_gate(1, metrics)
    held = await gate.acquire("a", "interactive", 1.0)
    leaving = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await settle()
    assert metrics.registry.get_sample_value(
        "gateway_admission_queue_depth", {"tier": "t", "priority": "interactive"}) == 1
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    assert len(gate.queue) == 0 and gate.in_flight == 1  # before any slot frees
    assert metrics.registry.get_sample_value(
        "gateway_admission_queue_depth", {"tier": "t", "priority": "interactive"}) == 0
    held.release()
    assert gate.in_flight == 0


async def test_a_client_that_leaves_as_it_is_granted_frees_the_slot() -> None:
    gate = make_gate(1)
    held = await gate.acquire("a", "interactive", 1.0)
    leaving = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await settle()
    held.release()  # grants "b": its future has a result ...
    assert gate.in_flight == 1
    leaving.cancel()  # ... and its client leaves before the task resumes
    await asyncio.gather(leaving, return_exceptions=True)
    assert gate.in_flight == 0 and gate.has_room()


async def test_waited_is_measured_from_the_queue() -> None:
    metrics = GatewayMetrics()
    gate = make_gate(1, metrics)
    held = await gate.acquire("a", "interactive", 1.0)
    assert held.waited_s == 0.0
    waiting = asyncio.create_task(gate.acquire("b", "interactive", 5.0))
    await asyncio.sleep(0.05)
    held.release()
    permit = await asyncio.wait_for(waiting, 5.0)
    assert 0.04 <= permit.waited_s < 5.0
    assert metrics.registry.get_sample_value("gateway_admission_wait_seconds_count", {"tier": "t"}) == 2
    assert metrics.registry.get_sample_value("gateway_admission_wait_seconds_sum", {"tier": "t"}) == pytest.approx(
        permit.waited_s)


async def test_a_short_deadline_is_kept() -> None:
    gate = make_gate(1)
    held = await gate.acquire("a", "interactive", 1.0)
    started = time.perf_counter()
    with pytest.raises(Overloaded):
        await gate.acquire("b", "interactive", 0.02)
    assert time.perf_counter() - started < 0.9  # not rounded up to a second
    with pytest.raises(Overloaded):
        await gate.acquire("b", "interactive", -1.0)  # a deadline already past: expired at once
    held.release()


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


async def test_the_timeout_says_how_long_it_waited_and_how_long_to_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime()
    monkeypatch.setattr(gate_module, "time", clock)
    gate = make_gate(1)
    held = await gate.acquire("a", "interactive", 1.0)
    behind = asyncio.create_task(gate.acquire("b", "batch", 30.0))
    await settle()
    late = asyncio.create_task(gate.acquire("c", "interactive", 0.01))
    await settle()
    clock.now += 2.0  # the gate's clock: 2 s in the queue when its deadline fires
    with pytest.raises(Overloaded, match=r"^tier 't' is at capacity: no slot freed within 2000 ms$") as err:
        await asyncio.wait_for(late, 5.0)
    assert err.value.code == "queue_timeout"
    assert err.value.retry_after == pytest.approx(2.0)  # interactive: 0 ahead + 1 in flight + 1, 1 s each
    behind.cancel()
    await asyncio.gather(behind, return_exceptions=True)
    held.release()


class Recorder:
    def __init__(self, gate: TierGate) -> None:
        self.samples: list[float] = []
        self.releases: list[float] = []
        real_release = gate.on_release
        gate.on_sample = self.samples.append  # type: ignore[method-assign]

        def on_release(held_s: float) -> None:
            self.releases.append(held_s)
            real_release(held_s)

        gate.on_release = on_release  # type: ignore[method-assign]


async def test_a_permit_samples_once_and_releases_once() -> None:
    gate = make_gate(2)
    seen = Recorder(gate)
    permit = await gate.acquire("a", "interactive", 1.0)
    permit.sample(permit.granted_at + 0.25)
    permit.sample(permit.granted_at + 0.5)  # the first byte is the first one
    assert seen.samples == [pytest.approx(0.25)]
    permit.granted_at -= 2.0
    permit.release()
    permit.release()
    assert len(seen.releases) == 1 and 2.0 <= seen.releases[0] < 10.0
    assert gate.in_flight == 0
    released = await gate.acquire("a", "interactive", 1.0)
    released.release()
    released.sample(released.granted_at + 0.1)  # after its release a permit samples nothing
    assert seen.samples == [pytest.approx(0.25)]


async def test_the_hold_time_is_an_average_of_releases() -> None:
    gate = make_gate(2)
    gate.on_release(2.0)
    gate.in_flight = 1
    assert gate.hold_s == 2.0
    gate.on_release(1.0)
    assert gate.hold_s == pytest.approx(1.9)  # 2 + 0.1 * (1 - 2)


async def test_gauges_are_labelled_by_tier_and_priority() -> None:
    metrics = GatewayMetrics()
    gate = make_gate(1, metrics)
    assert metrics.registry.get_sample_value("gateway_admission_limit", {"tier": "t"}) == 1
    held = await gate.acquire("a", "interactive", 1.0)
    assert metrics.registry.get_sample_value("gateway_admission_in_flight", {"tier": "t"}) == 1
    waiting = asyncio.create_task(gate.acquire("b", "batch", 5.0))
    await settle()
    assert metrics.registry.get_sample_value("gateway_admission_queue_depth", {"tier": "t", "priority": "batch"}) == 1
    assert metrics.registry.get_sample_value(
        "gateway_admission_queue_depth", {"tier": "t", "priority": "interactive"}) == 0
    held.release()
    (await asyncio.wait_for(waiting, 5.0)).release()
    assert metrics.registry.get_sample_value("gateway_admission_queue_depth", {"tier": "t", "priority": "batch"}) == 0
    assert metrics.registry.get_sample_value("gateway_admission_in_flight", {"tier": "t"}) == 0


# --- the gradient limit, one sample at a time (gateway/admission/gradient.py) ---

from gateway.admission.gradient import GradientLimit  # noqa: E402
from gateway.admission.queue import WaitQueue  # noqa: E402

TARGET_400 = Admission(initial_limit=10, min_limit=1, max_limit=100, ttft_target_ms=400)


def gradient_after(short_s: float | None, long_s: float | None, ttft_s: float, in_flight: int = 10,
                   settings: Admission = TARGET_400) -> GradientLimit:
    limit = GradientLimit(10)
    limit.short_s, limit.long_s = short_s, long_s
    limit.on_sample(ttft_s, in_flight, settings)
    return limit


def test_a_fast_used_limit_grows_by_a_fifth_of_its_square_root() -> None:
    limit = gradient_after(None, None, 0.1)  # gradient 1: proposed 10 + sqrt(10), smoothed at 0.2
    assert limit.limit == pytest.approx(10 + 0.2 * 10 ** 0.5, rel=1e-12)
    assert (limit.short_s, limit.long_s) == (0.1, 0.1)


def test_queueing_in_ttft_lowers_the_gradient() -> None:
    limit = gradient_after(0.3, 0.1, 0.3)  # long 0.101: gradient (1.5 * 0.101 + 0.05) / 0.3
    assert limit.long_s == pytest.approx(0.101, rel=1e-12)
    gradient = (1.5 * 0.101 + 0.05) / 0.3
    assert limit.limit == pytest.approx(0.8 * 10 + 0.2 * (10 * gradient + 10 ** 0.5), rel=1e-12)


def test_above_the_target_the_gradient_is_at_most_target_over_ttft() -> None:
    limit = gradient_after(0.5, 0.5, 0.5)  # the baseline says fine, the target (0.4 s) says 0.8
    assert limit.limit == pytest.approx(0.8 * 10 + 0.2 * (10 * 0.8 + 10 ** 0.5), rel=1e-12)
    far = gradient_after(2.0, 2.0, 2.0)  # 0.4 / 2: held at half
    assert far.limit == pytest.approx(0.8 * 10 + 0.2 * (10 * 0.5 + 10 ** 0.5), rel=1e-12)


def test_a_baseline_far_above_recent_ttft_falls() -> None:
    limit = gradient_after(0.1, 1.0, 0.1)  # long 0.9955 is ~10x short: cut by 5 %
    assert limit.long_s == pytest.approx(0.9955 * 0.95, rel=1e-12)
    middle = gradient_after(0.1, 0.25, 0.1)  # long 0.24925: 2.49x, over 2: cut
    assert middle.long_s == pytest.approx(0.24925 * 0.95, rel=1e-12)
    exactly_twice = gradient_after(None, 0.2506281407035176, 0.125)  # long 0.25 = 2 x short: kept
    assert exactly_twice.long_s == 0.25


def test_the_limit_grows_only_while_at_least_half_of_it_is_used() -> None:
    assert gradient_after(None, None, 0.1, in_flight=5).limit > 10  # half used: grows
    assert gradient_after(None, None, 0.1, in_flight=4).limit == 10  # under half: no evidence


def test_the_gate_reports_the_limit_within_the_batch_slots() -> None:
    metrics = GatewayMetrics()
    gate = make_gate(10, metrics)
    gate.on_sample(0.1)
    assert metrics.registry.get_sample_value("gateway_admission_limit", {"tier": "t"}) == gate.limiter.limit
    gate.capacity = 2
    gate.on_sample(0.1)
    assert metrics.registry.get_sample_value("gateway_admission_limit", {"tier": "t"}) == 2


# --- the waiting room (gateway/admission/queue.py) ---

async def test_a_batch_share_of_one_admits_batch_first() -> None:
    queue = WaitQueue()
    for w in (queued_waiter("i"), queued_waiter("i"), queued_waiter("b", "batch"), queued_waiter("b", "batch")):
        queue.push(w)
    assert [w.priority for w in (queue.pop(1.0), queue.pop(1.0))] == ["batch", "batch"]  # type: ignore[union-attr]


async def test_removing_one_of_a_tenants_waiters_keeps_the_others() -> None:
    queue = WaitQueue()
    first, second, other = queued_waiter("a"), queued_waiter("a"), queued_waiter("b")
    for w in (first, second, other):
        queue.push(w)
    assert queue.remove(first)
    assert [queue.pop(0.0), queue.pop(0.0)] == [second, other]
    assert queue.remove(other) is False and queue.pop(0.0) is None
    queue.push(first)
    assert queue.remove(first) and queue.pop(0.0) is None  # its emptied line is gone too


def queued_waiter(tenant: str, priority: str = "interactive") -> Waiter:
    return Waiter(tenant, priority, asyncio.get_running_loop().create_future())  # type: ignore[arg-type]
