"""The sliding-window arithmetic and the in-process windows and budgets, pinned to exact numbers (issue 42:
mutants of gateway/limits/window.py and gateway/limits/local.py that the limiter's tests let survive).

A minute window counts the current fixed minute plus the previous one weighted by the share of it still
inside the last 60 s; `retry_after` is when `cost` more fits as that weight decays (else: the minute's end).
"""

from __future__ import annotations

import pytest

from gateway.limits.local import LocalBudgets, LocalWindows
from gateway.limits.window import WINDOW_S, WindowPosition, retry_after, used


def at(minute: int, second: float) -> WindowPosition:
    return WindowPosition.at(minute * WINDOW_S + second)


def test_the_position_is_the_minute_the_share_of_the_previous_one_and_the_seconds_left() -> None:
    position = WindowPosition.at(125.0)  # minute 2, 5 s in
    assert position.index == 2
    assert position.previous_weight == pytest.approx(55 / 60)
    assert position.seconds_left == pytest.approx(55.0)
    start = WindowPosition.at(120.0)
    assert (start.index, start.previous_weight, start.seconds_left) == (2, 1.0, 60.0)
    late = WindowPosition.at(45.0)  # minute 0, three quarters in
    assert (late.index, late.previous_weight, late.seconds_left) == (0, 0.25, 15.0)


def test_used_adds_the_previous_minute_at_its_weight() -> None:
    half = at(7, 30)
    assert used(3.0, 4.0, half) == 5.0
    assert used(3.0, 0.0, half) == 3.0


def test_retry_after_waits_until_the_previous_minute_has_decayed_enough() -> None:
    half = at(7, 30)  # weight 0.5, 30 s left
    # 20 now + 100 before at 0.5 = 70; one more against 60: 11 over, the previous minute sheds 100/60 a second
    assert retry_after(20.0, 100.0, 1.0, 60.0, half) == pytest.approx(11 / 100 * 60)
    # the previous minute's weighted share (50) cannot cover 51 over: wait for the minute to turn
    assert retry_after(60.0, 100.0, 1.0, 60.0, half) == pytest.approx(30.0)
    # 6 over with 10 * 0.5 = 5 left to decay: the minute's end, not 6 / 10 * 60 = 36 s
    assert retry_after(60.0, 10.0, 1.0, 60.0, half) == pytest.approx(30.0)


def test_retry_after_with_a_small_previous_minute() -> None:
    quarter = at(3, 15)  # weight 0.75, 45 s left
    # 59 + 1 * 0.75 + 1 = 60.75 against 60.5: 0.25 over, covered by the previous minute's 0.75
    assert retry_after(59.0, 1.0, 1.0, 60.5, quarter) == pytest.approx(15.0)


def test_retry_after_without_a_previous_minute_is_the_minute_end() -> None:
    half = at(7, 30)
    assert retry_after(60.0, 0.0, 1.0, 60.0, half) == pytest.approx(30.0)
    assert retry_after(0.0, 0.0, 1.0, 60.0, half) == pytest.approx(30.0)  # no division by an empty minute


def test_retry_after_is_at_least_one_second() -> None:
    half = at(7, 30)
    assert retry_after(11.0, 100.0, 1.0, 60.0, half) == pytest.approx(1.2)  # 2 over: 2 / 100 * 60
    assert retry_after(10.0, 100.0, 1.0, 60.0, half) == 1.0  # 1 over: 0.6 s, said as 1
    assert retry_after(5.0, 0.0, 1.0, 5.0, at(7, 58.5)) == pytest.approx(1.5)
    assert retry_after(5.0, 0.0, 1.0, 5.0, at(7, 59.5)) == 1.0


def test_local_windows_count_the_previous_minute_at_its_weight() -> None:
    windows = LocalWindows()
    for _ in range(10):
        assert windows.admit("a", 1, 10, at(9, 10)) is None
    assert windows.admit("a", 1, 10, at(9, 20)) == pytest.approx(40.0)  # full, nothing before: the minute's end
    half = at(10, 30)  # the previous minute's 10 count 5
    assert [windows.admit("a", 1, 10, half) for _ in range(5)] == [None] * 5
    assert windows.admit("a", 1, 10, half) == pytest.approx(6.0)  # 1 over: the previous 10 shed it in 6 s
    assert windows.admit("b", 1, 10, half) is None  # per key


def test_local_windows_refuse_without_charging() -> None:
    windows = LocalWindows()
    assert windows.admit("a", 8, 10, at(1, 0)) is None
    assert windows.admit("a", 3, 10, at(1, 1)) == pytest.approx(59.0)  # 11 > 10: wait for the minute's end
    assert windows.admit("a", 2, 10, at(1, 2)) is None  # the refused 3 were not charged


def test_adjust_corrects_the_current_minute() -> None:
    windows = LocalWindows()
    assert windows.admit("a", 10, 10, at(1, 0)) is None
    windows.adjust("a", -4, at(1, 5))  # 4 of the 10 tokens charged were not used
    assert windows.admit("a", 4, 10, at(1, 6)) is None
    assert windows.admit("a", 1, 10, at(1, 7)) is not None
    windows.adjust("a", -2, at(1, 8))
    windows.adjust("a", -1, at(1, 8))  # adjustments add up
    assert windows.admit("a", 3, 10, at(1, 9)) is None
    assert windows.admit("a", 1, 10, at(1, 9)) is not None


def test_charge_counts_what_was_admitted_elsewhere() -> None:
    windows = LocalWindows()
    windows.charge([("a:req", 3.0), ("a:tok", 50.0)], at(1, 0))
    windows.charge([("a:req", 2.0)], at(1, 1))
    assert windows.admit("a:req", 5, 10, at(1, 2)) is None
    assert windows.admit("a:req", 1, 10, at(1, 2)) is not None
    assert windows.admit("a:tok", 50, 100, at(1, 2)) is None
    assert windows.admit("a:tok", 1, 100, at(1, 2)) is not None


def fill_stale(windows: LocalWindows, count: int, minute: int) -> None:
    windows.charge([(f"stale{i}", 1.0) for i in range(count)], at(minute, 0))


@pytest.mark.parametrize("through", ["admit", "charge"])
def test_past_4096_windows_those_before_the_previous_minute_are_forgotten(through: str) -> None:
    windows = LocalWindows()
    windows.charge([("a", 10.0)], at(9, 0))  # the previous minute of minute 10: must stay
    fill_stale(windows, 4094, 8)  # two minutes back: forgotten once there are more than 4096
    if through == "admit":
        assert windows.admit("a", 0, 10, at(10, 30)) is None  # a@9, a@10 and 4094 stale: 4096, none forgotten
        assert len(windows._counts) == 4096
        assert windows.admit("b", 0, 10, at(10, 30)) is None  # the 4097th
    else:
        windows.charge([("a", 0.0)], at(10, 30))
        assert len(windows._counts) == 4096
        windows.charge([("b", 0.0)], at(10, 30))
    assert sorted(windows._counts) == [("a", 9), ("a", 10), ("b", 10)]
    half = at(10, 30)  # the previous minute still weighs 10 * 0.5
    assert [windows.admit("a", 1, 10, half) for _ in range(5)] == [None] * 5
    assert windows.admit("a", 1, 10, half) is not None


def test_budgets_add_up_per_key_and_day() -> None:
    budgets = LocalBudgets()
    assert budgets.spent("a", "2026-01-01") == 0.0
    budgets.add("a", "2026-01-01", 0.25)
    budgets.add("a", "2026-01-01", 0.5)
    budgets.add("a", "2026-01-02", 2.0)
    budgets.add("b", "2026-01-01", 1.0)
    assert budgets.spent("a", "2026-01-01") == 0.75
    assert budgets.spent("a", "2026-01-02") == 2.0
    assert budgets.spent("b", "2026-01-01") == 1.0
    assert budgets.spent("b", "2026-01-02") == 0.0


# --- the limiter against a real Redis, and its local share (gateway/limits/limiter.py, replicas.py) ---

import hashlib  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402
from typing import Any  # noqa: E402

from redis.asyncio import Redis  # noqa: E402

from gateway.cache.background import BackgroundWrites  # noqa: E402
from gateway.cache.connection import connect  # noqa: E402
from gateway.cache.guard import RedisGuard  # noqa: E402
from gateway.clock import day_key  # noqa: E402
from gateway.config.tenants import TenantPolicy  # noqa: E402
from gateway.errors import RateLimited  # noqa: E402
from gateway.limits.limiter import Limiter  # noqa: E402
from gateway.limits.replicas import Replicas  # noqa: E402
from gateway.metrics import GatewayMetrics  # noqa: E402
from gateway.testing import gateway_config, tier  # noqa: E402


def tenant(name: str = "acme", **limits: Any) -> TenantPolicy:
    key_hash = hashlib.sha256(name.encode()).hexdigest()
    config = gateway_config([tier("t", ["http://127.0.0.1:1/v1"])],
                            policy={"tenants": [{"name": name, "api_key_sha256": key_hash, **limits}]})
    return config.tenants_by_key_hash[key_hash]


async def redis_limiter(url: str, replicas: int = 1) -> tuple[Limiter, BackgroundWrites, Redis]:
    writes = BackgroundWrites()
    guard = RedisGuard(connect(url), op_timeout_s=1.0)
    return Limiter(guard, writes, Replicas(guard, lambda: replicas), GatewayMetrics()), writes, Redis.from_url(url)


async def refusal(limiter: Limiter, who: TenantPolicy, cost: int = 1) -> RateLimited | None:
    try:
        await limiter.admit(who, cost)
    except RateLimited as exc:
        return exc
    return None


def minute() -> int:
    return math.floor(time.time() / WINDOW_S)


async def test_redis_counts_requests_per_tenant_and_says_which_limit(redis_url: str) -> None:
    limiter, _, redis = await redis_limiter(redis_url)
    a, b = tenant("a", rate_limit={"requests_per_min": 3}), tenant("b", rate_limit={"requests_per_min": 3})
    assert [await refusal(limiter, a) for _ in range(3)] == [None] * 3
    denied = await refusal(limiter, a)
    assert denied is not None and denied.code == "rate_limit_requests" and denied.status == 429
    assert "'a' is over its requests per minute limit" in str(denied)
    assert denied.retry_after is not None and 1.0 <= denied.retry_after <= 60.0
    assert await refusal(limiter, b) is None  # another tenant: its own window
    index = minute()
    assert int(await redis.get(f"rl:{{a}}:req:{index}") or 0) == 3  # the refused one was not counted
    assert 60 < await redis.ttl(f"rl:{{a}}:req:{index}") <= 120  # two windows long
    await redis.aclose()


async def test_redis_counts_tokens_and_the_retry_waits_for_the_window(redis_url: str) -> None:
    limiter, _, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"tokens_per_min": 100})
    assert await refusal(limiter, a, 60) is None
    assert await refusal(limiter, a, 40) is None
    denied = await refusal(limiter, a, 1)
    assert denied is not None and denied.code == "rate_limit_tokens"
    assert "tokens per minute" in str(denied)
    position = WindowPosition.at(time.time())
    assert denied.retry_after == pytest.approx(max(1.0, position.seconds_left), abs=2.0)  # nothing before: the turn
    assert int(await redis.get(f"rl:{{a}}:tok:{minute()}") or 0) == 100
    assert await redis.get(f"rl:{{a}}:req:{minute()}") is None  # no request limit: no request count
    await redis.aclose()


async def test_the_previous_minute_in_redis_weighs_in(redis_url: str) -> None:
    limiter, _, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"requests_per_min": 10})
    position = WindowPosition.at(time.time())
    await redis.set(f"rl:{{a}}:req:{position.index - 1}", 10)
    admitted = 0
    while await refusal(limiter, a) is None:
        admitted += 1
        assert admitted <= 10
    weight = WindowPosition.at(time.time()).previous_weight
    assert admitted in {math.floor(10 - 10 * weight + 1e-9), math.floor(10 - 10 * position.previous_weight + 1e-9)}
    await redis.aclose()


async def test_the_daily_budget_is_the_tenants_own_in_redis(redis_url: str) -> None:
    limiter, writes, redis = await redis_limiter(redis_url)
    a = tenant("a", daily_budget_usd=1.0)
    b = tenant("b", daily_budget_usd=1.0)
    assert await refusal(limiter, a) is None
    limiter.book(a, 0, 0.75)
    limiter.book(a, 0, 0.25)
    limiter.book(a, 0, 0.0)  # nothing spent: nothing booked
    await writes.drain()
    day = day_key(time.time())
    assert float(await redis.get(f"rl:{{a}}:usd:{day}")) == pytest.approx(1.0)
    assert 86400 < await redis.ttl(f"rl:{{a}}:usd:{day}") <= 2 * 86400
    denied = await refusal(limiter, a)
    assert denied is not None and denied.code == "budget_exhausted" and "daily budget of $1.0" in str(denied)
    now = datetime.now(UTC)
    to_midnight = 86400 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)
    assert denied.retry_after == pytest.approx(to_midnight, abs=5.0)
    assert await refusal(limiter, b) is None  # b's budget is untouched
    await redis.aclose()


async def test_book_corrects_the_token_charge_in_redis_and_locally(redis_url: str) -> None:
    limiter, writes, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"tokens_per_min": 100})
    assert await refusal(limiter, a, 100) is None
    limiter.book(a, -40, 0.0)  # 40 of the 100 charged were not used
    await writes.drain()
    assert int(await redis.get(f"rl:{{a}}:tok:{minute()}")) == 60
    assert await refusal(limiter, a, 40) is None
    assert await refusal(limiter, a, 1) is not None
    limiter.book(a, 0, 0.0)
    await writes.drain()
    assert int(await redis.get(f"rl:{{a}}:tok:{minute()}")) == 100
    await redis.aclose()


async def test_what_redis_admitted_is_charged_to_the_local_share(redis_url: str) -> None:
    limiter, _, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"requests_per_min": 4})
    b = tenant("b", rate_limit={"tokens_per_min": 100})
    assert [await refusal(limiter, a) for _ in range(2)] == [None, None]
    assert [await refusal(limiter, b, 30) for _ in range(2)] == [None, None]
    await redis.flushall()  # Redis forgets; the replica still knows a used 2 requests and b 60 tokens
    limiter._script = None  # and Redis cannot decide any more: the local share decides
    assert [await refusal(limiter, a) for _ in range(2)] == [None, None]
    requests = await refusal(limiter, a)
    assert requests is not None and requests.code == "rate_limit_requests"
    assert await refusal(limiter, b, 40) is None
    tokens = await refusal(limiter, b, 1)
    assert tokens is not None and tokens.code == "rate_limit_tokens"
    await redis.aclose()


async def test_without_redis_the_budget_share_is_the_budget_over_the_replicas() -> None:
    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: 4), GatewayMetrics())
    a = tenant("a", daily_budget_usd=2.0)
    assert await refusal(limiter, a) is None
    limiter.book(a, 0, 0.4)
    assert await refusal(limiter, a) is None  # 0.4 < 2 / 4
    limiter.book(a, 0, 0.1)
    denied = await refusal(limiter, a)
    assert denied is not None and denied.code == "budget_exhausted"
    assert await refusal(limiter, tenant("b", daily_budget_usd=2.0)) is None


async def test_a_tenant_without_limits_is_never_refused_nor_booked(redis_url: str) -> None:
    limiter, writes, redis = await redis_limiter(redis_url)
    free = tenant("free")
    for _ in range(5):
        assert await refusal(limiter, free, 10**6) is None
    limiter.book(free, 10**6, 5.0)
    await writes.drain()
    assert await redis.keys("rl:*") == []
    await redis.aclose()


async def test_heartbeats_count_the_replicas_and_leaving_uncounts_at_once(redis_url: str) -> None:
    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    first, second = Replicas(guard, lambda: 1, every_s=5.0), Replicas(guard, lambda: 1, every_s=5.0)
    assert first.id != second.id and len(first.id) == 16
    await first.beat()
    assert first.seen == 1
    await second.beat()
    await first.beat()
    assert (first.seen, first.count) == (2, 2)
    redis = Redis.from_url(redis_url)
    assert 15 < await redis.ttl("gw:replicas") <= 16  # forgotten after 3 missed beats of 5 s (+1)
    await second.leave()
    await first.beat()
    assert first.seen == 1
    assert Replicas(guard, lambda: 3).count == 3  # the configured floor
    await redis.aclose()


async def test_replicas_run_beats_until_stopped_then_leave(redis_url: str) -> None:
    import asyncio

    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    replicas = Replicas(guard, lambda: 1, every_s=0.05)
    redis = Redis.from_url(redis_url)
    stop = asyncio.Event()
    task = asyncio.create_task(replicas.run(stop))
    await asyncio.sleep(0.2)
    assert await redis.zscore("gw:replicas", replicas.id) is not None
    stop.set()
    await asyncio.wait_for(task, 5.0)
    assert await redis.zscore("gw:replicas", replicas.id) is None
    await redis.aclose()


async def away_from_the_minute_turn() -> None:
    """Sleep past the next minute's start when it is under 5 s away (a retry computed across it would differ)."""
    import asyncio

    left = WindowPosition.at(time.time()).seconds_left
    if left < 5:
        await asyncio.sleep(left + 0.1)


class FixedClock:
    """The limiter's `time` module with a wall clock stopped at `now` (monotonic time still runs)."""

    def __init__(self, now: float) -> None:
        self.now = now
        self.monotonic = time.monotonic

    def time(self) -> float:
        return self.now


SIX_SECONDS_IN = (minute() + 10) * WINDOW_S + 6.0  # the previous minute weighs 0.9


async def test_a_redis_refusal_waits_as_the_previous_minute_decays(redis_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.limits import limiter as limiter_module

    monkeypatch.setattr(limiter_module, "time", FixedClock(SIX_SECONDS_IN))
    index = WindowPosition.at(SIX_SECONDS_IN).index
    limiter, _, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"requests_per_min": 10, "tokens_per_min": 10_000})
    await redis.set(f"rl:{{a}}:req:{index - 1}", 10)  # weighs 9
    assert await refusal(limiter, a, 5) is None  # 0 + 9 + 1 = 10
    denied = await refusal(limiter, a, 5)  # 1 + 9 + 1 = 11: one over, and the previous 10 shed one in 6 s
    assert denied is not None and denied.code == "rate_limit_requests"
    assert denied.retry_after == pytest.approx(6.0)
    await redis.aclose()


async def test_a_redis_token_refusal_waits_for_its_tokens(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.limits import limiter as limiter_module

    monkeypatch.setattr(limiter_module, "time", FixedClock(SIX_SECONDS_IN))
    index = WindowPosition.at(SIX_SECONDS_IN).index
    limiter, _, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"requests_per_min": 1000, "tokens_per_min": 100})
    await redis.set(f"rl:{{a}}:tok:{index - 1}", 100)  # weighs 90
    assert await refusal(limiter, a, 10) is None  # 0 + 90 + 10 = 100
    denied = await refusal(limiter, a, 10)  # 10 + 90 + 10 = 110: 10 over, the previous 100 shed them in 6 s
    assert denied is not None and denied.code == "rate_limit_tokens"
    assert denied.retry_after == pytest.approx(6.0)
    assert int(await redis.get(f"rl:{{a}}:tok:{index}")) == 10
    await redis.aclose()


async def test_redis_calls_are_named_in_the_guards_metrics(redis_url: str) -> None:
    limiter, writes, redis = await redis_limiter(redis_url)
    guard = limiter._guard
    assert guard is not None
    a = tenant("a", rate_limit={"tokens_per_min": 100}, daily_budget_usd=5.0)
    await limiter.admit(a, 10)
    limiter.book(a, -5, 0.5)
    await writes.drain()
    replicas = Replicas(guard, lambda: 1)
    await replicas.beat()
    await replicas.leave()

    def count(op: str) -> float | None:
        return guard.registry.get_sample_value("gateway_redis_op_seconds_count", {"op": op})

    assert (count("limits_admit"), count("limits_book"), count("replicas_beat"), count("replicas_leave")) == (
        1, 2, 1, 1)
    await redis.aclose()


async def test_the_limiter_and_the_heartbeat_have_their_own_time_budgets(redis_url: str) -> None:
    hasty = RedisGuard(connect(redis_url), op_timeout_s=1e-9)  # the caches' budget: nothing answers within it
    limiter = Limiter(hasty, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())
    assert limiter.timeout_s == 2.0
    a = tenant("a", rate_limit={"requests_per_min": 1})
    await limiter.admit(a, 1)
    denied = await refusal(limiter, a)
    assert denied is not None and dict(limiter.local_decisions) == {}  # Redis decided both
    other = Replicas(RedisGuard(connect(redis_url), op_timeout_s=1.0), lambda: 1)
    await other.beat()
    mine = Replicas(hasty, lambda: 1, every_s=1.0)
    assert Replicas(None, lambda: 1).every_s == 2.0
    await mine.beat()
    assert mine.seen == 2


async def test_a_redis_that_does_not_answer_in_time_is_a_local_decision_said_once(redis_url: str) -> None:
    import structlog

    metrics = GatewayMetrics()
    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    limiter = Limiter(guard, BackgroundWrites(), Replicas(None, lambda: 1), metrics, timeout_s=1e-9)
    a = tenant("a", rate_limit={"requests_per_min": 100})
    with structlog.testing.capture_logs() as logs:
        await limiter.admit(a, 1)
        await limiter.admit(a, 1)
    assert metrics.registry.get_sample_value("gateway_limits_local_decisions_total",
                                             {"reason": "redis_no_answer"}) == 2
    assert limiter.local_decisions["a"] == 2
    assert [(e["reason"], e["replicas"]) for e in logs if e["event"] == "limits_local"] == [("redis_no_answer", 1)]


async def test_no_redis_at_all_is_no_warning() -> None:
    import structlog

    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())
    with structlog.testing.capture_logs() as logs:
        await limiter.admit(tenant("a", rate_limit={"requests_per_min": 100}), 1)
    assert [e for e in logs if e["event"] == "limits_local"] == []
    assert limiter.local_decisions["a"] == 1


async def test_local_refusals_say_when_to_come_back() -> None:
    await away_from_the_minute_turn()
    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())
    a = tenant("a", rate_limit={"requests_per_min": 1})
    b = tenant("b", rate_limit={"tokens_per_min": 10})
    assert await refusal(limiter, a) is None and await refusal(limiter, b, 10) is None
    left = WindowPosition.at(time.time()).seconds_left
    requests, tokens = await refusal(limiter, a), await refusal(limiter, b, 1)
    assert requests is not None and requests.retry_after == pytest.approx(left, abs=0.5)
    assert tokens is not None and tokens.code == "rate_limit_tokens"
    assert tokens.retry_after == pytest.approx(left, abs=0.5)


async def test_book_writes_a_single_token_and_no_zero_spend(redis_url: str) -> None:
    limiter, writes, redis = await redis_limiter(redis_url)
    a = tenant("a", rate_limit={"tokens_per_min": 100}, daily_budget_usd=1.0)
    limiter.book(a, 1, 0.0)
    await writes.drain()
    assert int(await redis.get(f"rl:{{a}}:tok:{minute()}")) == 1
    assert await redis.keys("rl:{a}:usd:*") == []
    await redis.aclose()


@pytest.fixture
def new_york() -> Any:
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    mp.undo()
    time.tzset()


async def test_a_spent_budget_comes_back_at_utc_midnight(new_york: None) -> None:
    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())
    a = tenant("a", daily_budget_usd=1.0)
    limiter.book(a, 0, 1.0)
    denied = await refusal(limiter, a)
    now = datetime.now(UTC)
    to_midnight = 86400 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)
    assert denied is not None and denied.retry_after == pytest.approx(to_midnight, abs=0.25)


async def test_replicas_beat_again_and_again(redis_url: str) -> None:
    import asyncio

    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    replicas = Replicas(guard, lambda: 1, every_s=0.05)
    redis = Redis.from_url(redis_url)
    stop = asyncio.Event()
    task = asyncio.create_task(replicas.run(stop))
    await asyncio.sleep(0.1)
    first = await redis.zscore("gw:replicas", replicas.id)
    await asyncio.sleep(0.3)
    later = await redis.zscore("gw:replicas", replicas.id)
    stop.set()
    await asyncio.wait_for(task, 5.0)
    assert first is not None and later is not None and later > first
    await redis.aclose()
