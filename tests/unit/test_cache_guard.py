"""RedisGuard with scripted calls: timeouts, backoff, the single probe, metrics and logs."""

from __future__ import annotations

import asyncio
import time

import pytest
import structlog
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.cache.guard import RedisGuard


class Script:
    """A Redis call that fails (or hangs) while `failing` is set, and counts how often it ran."""

    def __init__(self, failure: str = "connection") -> None:
        self.calls = 0
        self.failing = False
        self.failure = failure

    async def __call__(self) -> str:
        self.calls += 1
        if self.failing:
            if self.failure == "hang":
                await asyncio.sleep(30)  # far past any bound a test sets: only the guard's timeout ends it
            raise RedisConnectionError("refused") if self.failure == "connection" else ResponseError("WRONGTYPE")
        return "ok"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def guard(registry: CollectorRegistry) -> RedisGuard:
    return RedisGuard(Redis(port=1), down_after_s=0.0, op_timeout_s=0.01, down_backoff_s=0.1, registry=registry, timeouts_to_down=1)


async def test_success_passes_the_value_through_and_is_timed(guard: RedisGuard, registry: CollectorRegistry) -> None:
    assert await guard.run("get", Script()) == "ok"
    assert registry.get_sample_value("gateway_redis_op_seconds_count", {"op": "get"}) == 1
    assert registry.get_sample_value("gateway_redis_up") == 1


async def test_a_hanging_call_returns_none_within_the_timeout(guard: RedisGuard, registry: CollectorRegistry) -> None:
    script = Script("hang")
    script.failing = True
    start = time.perf_counter()
    assert await guard.run("get", script) is None
    assert time.perf_counter() - start < 2.0  # did not hang: the 10 ms timeout ended it
    assert not guard.up and registry.get_sample_value("gateway_redis_up") == 0
    assert registry.get_sample_value("gateway_redis_errors_total", {"op": "get"}) == 1


async def test_by_default_only_timeouts_in_a_row_mark_redis_down() -> None:
    guard = RedisGuard(Redis(port=1), down_after_s=0.0, op_timeout_s=0.01, down_backoff_s=0.1)
    script = Script("hang")
    for _ in range(2):
        script.failing = True
        assert await guard.run("get", script) is None and await guard.run("get", script) is None
        script.failing = False
        assert await guard.run("get", script) == "ok"  # a success resets the count
    script.failing = True
    for _ in range(3):
        assert guard.up and await guard.run("get", script) is None
    assert not guard.up and script.calls == 9
    assert await guard.run("get", script) is None and script.calls == 9


async def test_down_skips_calls_during_backoff_then_one_probe_recovers(guard: RedisGuard) -> None:
    script = Script()
    script.failing = True
    with structlog.testing.capture_logs() as logs:
        assert await guard.run("get", script) is None
        for _ in range(50):
            assert await guard.run("get", script) is None
        assert script.calls == 1  # skipped: no connect attempt per request while down
        await asyncio.sleep(0.12)
        assert await guard.run("get", script) is None  # the probe fails: back off again
        assert script.calls == 2 and not guard.up
        script.failing = False
        assert await guard.run("get", script) is None and script.calls == 2
        await asyncio.sleep(0.12)
        assert await guard.run("get", script) == "ok"
    assert guard.up and script.calls == 3
    events = [entry["event"] for entry in logs]
    assert events == ["redis_unavailable", "redis_recovered"]  # the second failure is rate-limited


async def test_only_one_probe_goes_through_at_a_time(guard: RedisGuard) -> None:
    script = Script("hang")
    script.failing = True
    await guard.run("get", script)
    await asyncio.sleep(0.12)
    results = await asyncio.gather(*(guard.run("get", script, timeout_s=0.05) for _ in range(10)))
    assert results == [None] * 10 and script.calls == 2


async def test_a_command_error_returns_none_but_keeps_redis_up(guard: RedisGuard, registry: CollectorRegistry) -> None:
    script = Script("response")
    script.failing = True
    with structlog.testing.capture_logs() as logs:
        assert await guard.run("set", script) is None
    assert guard.up and registry.get_sample_value("gateway_redis_errors_total", {"op": "set"}) == 1
    assert [entry["event"] for entry in logs] == ["redis_op_failed"]
    assert await guard.run("set", script) is None and script.calls == 2  # not skipped


async def test_cancellation_is_not_swallowed(guard: RedisGuard) -> None:
    script = Script("hang")
    script.failing = True
    task = asyncio.ensure_future(guard.run("get", script, timeout_s=5))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_one_stall_that_times_out_many_calls_at_once_does_not_switch_redis_off() -> None:
    guard = RedisGuard(Redis(port=1), op_timeout_s=0.01, down_backoff_s=1.0)  # the default down_after_s

    async def slow() -> int:
        await asyncio.sleep(0.05)  # an event-loop stall, seen by every call pending at that moment
        return 1

    results = await asyncio.gather(*(guard.run("get", slow) for _ in range(8)))
    assert results == [None] * 8
    assert guard.up  # a burst is not an outage: the next call still goes to Redis

    async def fast() -> int:
        return 2

    assert await guard.run("get", fast) == 2


async def test_a_redis_that_answers_late_every_time_is_slow_not_down() -> None:
    """Each call times out, but its reply does arrive: Redis is alive, so it is never marked down."""
    guard = RedisGuard(Redis(port=1), op_timeout_s=0.01, down_after_s=0.0, timeouts_to_down=3)

    async def late() -> int:
        await asyncio.sleep(0.03)
        return 1

    for _ in range(5):
        assert await guard.run("get", late) is None
        await asyncio.sleep(0.04)  # the reply lands before the next call
    assert guard.up
