"""Limits and budgets are per tenant, and the spend booked is the spend priced: each test passes or fails alone
(no reliance on another test having used the same Redis first), against a real Redis and without one (the
local windows that decide while Redis is down)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cache.background import BackgroundWrites
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.config import GatewayConfig
from gateway.config.tenants import TenantPolicy
from gateway.errors import RateLimited
from gateway.limits.limiter import Limiter
from gateway.limits.replicas import Replicas
from gateway.metrics import GatewayMetrics
from gateway.testing import gateway_config, tier
from tests.conftest import StartApp, StartEmulator

BODY = {"model": "t", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5, "ignore_eos": True}


def key_of(name: str) -> str:
    return f"sk-{name}"


def tenants_config(url: str, **limits: Any) -> GatewayConfig:
    """Tenants `a` and `b` with the same `limits`, over one tier at `url`."""
    tenants = [{"name": name, "api_key_sha256": hashlib.sha256(key_of(name).encode()).hexdigest(), **limits}
               for name in ("a", "b")]
    return gateway_config([tier("t", [url])], policy={"tenants": tenants})


def tenants(**limits: Any) -> tuple[TenantPolicy, TenantPolicy]:
    config = tenants_config("http://127.0.0.1:1/v1", **limits)
    by_name = {t.name: t for t in config.tenants_by_key_hash.values()}
    return by_name["a"], by_name["b"]


@pytest.fixture(params=["redis", "local"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    """A limiter deciding in Redis (the session's, emptied), or locally (no Redis: one replica's windows)."""
    if request.param == "local":
        yield Limiter(None, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())
        return
    url = request.getfixturevalue("redis_url")
    guard = RedisGuard(connect(url), op_timeout_s=1.0)
    yield Limiter(guard, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics(), timeout_s=2.0)
    await guard.client.aclose()


async def admitted(limiter: Limiter, tenant: TenantPolicy, count: int, cost: int = 1) -> int:
    passed = 0
    for _ in range(count):
        try:
            await limiter.admit(tenant, cost)
            passed += 1
        except RateLimited:
            pass
    return passed


async def test_one_tenants_requests_per_minute_do_not_use_up_anothers(limiter: Limiter) -> None:
    """Pins: the request window is counted per tenant (a key without the tenant shares one window)."""
    a, b = tenants(rate_limit={"requests_per_min": 3})
    assert await admitted(limiter, a, 5) == 3
    assert await admitted(limiter, b, 5) == 3  # b's own 3, untouched by a's
    assert await admitted(limiter, a, 1) == 0


async def test_one_tenants_tokens_per_minute_do_not_use_up_anothers(limiter: Limiter) -> None:
    """Pins: the token window is counted per tenant."""
    a, b = tenants(rate_limit={"tokens_per_min": 100})
    assert await admitted(limiter, a, 4, cost=40) == 2
    assert await admitted(limiter, b, 4, cost=40) == 2


async def test_one_tenants_spend_does_not_use_up_anothers_daily_budget(limiter: Limiter) -> None:
    """Pins: the day's spend is kept per tenant (a budget key without the tenant would stop b for a's spend)."""
    a, b = tenants(daily_budget_usd=1.0)
    await limiter.admit(a, 1)
    limiter.book(a, 0, 1.5)  # a is over its budget
    await asyncio.sleep(0.2)  # the booking reaches Redis in the background
    with pytest.raises(RateLimited) as refused:
        await limiter.admit(a, 1)
    assert refused.value.code == "budget_exhausted"
    await limiter.admit(b, 1)  # b has spent nothing: admitted
    limiter.book(b, 0, 0.5)
    await asyncio.sleep(0.2)
    await limiter.admit(b, 1)  # 0.5 of 1.0: still admitted


# -- through the gateway: the spend booked is what the request line priced -------------------------------------

async def post(session: aiohttp.ClientSession, url: str, key: str) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{url}/v1/chat/completions", json=BODY,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, orjson.loads(await response.read())


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "local"])
async def test_the_budget_admits_exactly_the_requests_its_amount_pays_for(
        start_emulator: StartEmulator, start_app: StartApp, request: pytest.FixtureRequest, with_redis: bool) -> None:
    """Pins: each answer's full cost is booked against the day's budget (a fifth of it would let ~17 through
    instead of 4), and tenant b's budget is untouched by a's spend. A budget of 3.5 answers admits 4: the
    spend is checked before each request (3 spent < 3.5), and the 5th sees 4 spent."""
    emulator = await start_emulator()
    redis_url = request.getfixturevalue("redis_url") if with_redis else None
    free = await start_app(create_app(tenants_config(f"{emulator.url}/v1"), redis_url=redis_url))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, answer = await post(session, free, key_of("a"))
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        (line,) = [e for e in logs if e["event"] == "request"]
        cost = line["cost_usd"]  # 1 USD per 1M prompt tokens, 2 per 1M completion tokens
        assert cost == pytest.approx((answer["usage"]["prompt_tokens"] * 1 + 5 * 2) / 1e6) and cost > 0
        if redis_url is not None:
            import redis

            with redis.Redis.from_url(redis_url) as client:
                client.flushall()  # the calibrating gateway's tenants have no budget; start from nothing anyway
        budgeted = await start_app(create_app(tenants_config(f"{emulator.url}/v1", daily_budget_usd=3.5 * cost),
                                              redis_url=redis_url))
        statuses = []
        with capture_logs() as logs:
            for _ in range(6):
                statuses.append((await post(session, budgeted, key_of("a")))[0])
                await asyncio.sleep(0.1)  # the spend is booked after the answer, in the background
        assert statuses == [200, 200, 200, 200, 429, 429], statuses
        served = [e for e in logs if e["event"] == "request" and e["status"] == 200]
        assert [e["cost_usd"] for e in served] == pytest.approx([cost] * 4)
        status, refusal = await post(session, budgeted, key_of("a"))
        assert status == 429 and refusal["error"]["code"] == "budget_exhausted"
        assert (await post(session, budgeted, key_of("b")))[0] == 200  # b's budget: its own
