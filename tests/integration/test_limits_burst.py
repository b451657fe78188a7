"""Global limits under concurrent bursts: three `gateway serve` processes on one real Redis, every
request of a burst sent at once, spread over the three, with the production Redis settings. With
Redis answering, a limit admits exactly its number (README, "Limits across replicas": no tolerance
while the fixed minute does not turn, which the test waits for), however slow the burst makes each
Redis call; and a slow Redis is not an outage (one gateway, Redis paused by CLIENT PAUSE)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
import redis

from gateway.app import create_app
from gateway.config import GatewayConfig, RoutesConfig
from gateway.local.redis_server import EmbeddedRedis
from gateway.testing import gateway_config, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_replicas import Replica, spawn_emulator, start_gateways

PROMPT = "hi"  # 2 characters: the admission charge of a request is 1 input token + its max_tokens
PROMPT_TOKENS = 1  # the reading's estimate of "hi" (gateway.reading: characters / 4, rounded up)
TOKENS = 50  # max_tokens of a token-limited request (the backend streams them all: ~0.4 s)
# (tenant, requests sent at once, the limit, what is limited): one fresh tenant per burst
BURSTS = [("r30", 60, 30, "requests"), ("r100", 300, 100, "requests"),
          ("t30", 60, 30, "tokens"), ("t100", 300, 100, "tokens")]


def key_of(tenant: str) -> str:
    return f"sk-{tenant}"


def tenant(name: str, limit: int, kind: str) -> dict[str, Any]:
    per_min = {"requests_per_min": limit} if kind == "requests" else {"tokens_per_min": limit * (PROMPT_TOKENS + TOKENS)}
    return {"name": name, "api_key_sha256": hashlib.sha256(key_of(name).encode()).hexdigest(), "rate_limit": per_min}


def burst_config(backend: str) -> GatewayConfig:
    """Tier `t` over `backend` with the production Redis budget (20 ms a call); one tenant per burst.
    Admission control is wide open: this test is about the limiter, not about shedding."""
    config = gateway_config([tier("t", [backend])], policy={
        "max_tokens": {"default": 1, "maximum": 1024},
        "tenants": [tenant(name, limit, kind) for name, _, limit, kind in BURSTS]},
        admission={"initial_limit": 128, "max_wait_ms": 10_000})  # what the limiter admits, the tier serves
    routes = RoutesConfig.model_validate({**config.routes.model_dump(), "redis": {}})
    return GatewayConfig.build(routes, config.policy)


@pytest.fixture(scope="module")
def three_gateways(tmp_path_factory: pytest.TempPathFactory, redis_server: EmbeddedRedis) -> Iterator[list[Replica]]:
    folder = tmp_path_factory.mktemp("burst")
    started: list[subprocess.Popen[bytes]] = []
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    try:
        backend = spawn_emulator(folder, started, profile="int4")
        yield start_gateways(folder, started, burst_config(backend), 3, "--redis-url", redis_server.url)
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
            process.wait()


async def wait_for_minute_room(seconds: float = 15.0) -> None:
    """Start a burst with `seconds` left in the fixed minute: the window must not turn mid-burst."""
    into = time.time() % 60
    if into > 60 - seconds:
        await asyncio.sleep(60 - into + 0.5)


async def burst(urls: list[str], name: str, count: int, kind: str) -> list[int]:
    """`count` requests at once, round-robin over the gateways at `urls`; their statuses."""
    body = {"model": "t", "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": TOKENS if kind == "tokens" else 1}
    if kind == "tokens":
        body["ignore_eos"] = True  # the emulator streams all max_tokens: answers end after every admission
    headers = {"Authorization": f"Bearer {key_of(name)}"}
    gate = asyncio.Event()

    async def one(session: aiohttp.ClientSession, url: str) -> int:
        await gate.wait()
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as response:
            await response.read()
            return response.status

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        tasks = [asyncio.create_task(one(session, urls[i % len(urls)])) for i in range(count)]
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*tasks)


async def scrape(url: str) -> tuple[dict[str, Any], str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/readyz") as response:
            ready = orjson.loads(await response.read())
        async with session.get(f"{url}/metrics") as response:
            return ready, await response.text()


def admit_calls(metrics: str) -> tuple[float, float, float]:
    """Limiter calls answered, and those of them slower than 20 ms (the caches' budget) and 250 ms."""
    def sample(name: str, labels: str) -> float:
        found = re.search(rf"^gateway_redis_op_seconds_{name}\{{{labels}\}} (\S+)$", metrics, re.M)
        return float(found.group(1)) if found else 0.0

    total = sample("count", 'op="limits_admit"')
    over = [total - sample("bucket", f'le="{bound}",op="limits_admit"') for bound in ("0.02", "0.25")]
    return total, over[0], over[1]


def local_decisions(metrics: str) -> float:
    return sum(float(v) for v in re.findall(r'^gateway_limits_local_decisions_total\{[^}]*\} (\S+)$', metrics, re.M))


@pytest.mark.parametrize(("name", "count", "limit", "kind"), BURSTS, ids=[b[0] for b in BURSTS])
async def test_a_concurrent_burst_admits_exactly_the_global_limit(three_gateways: list[Replica], name: str,
                                                                   count: int, limit: int, kind: str) -> None:
    for _ in range(100):  # heartbeats: every gateway knows there are three
        states = [(await scrape(g.url))[0] for g in three_gateways]
        if all(s.get("replicas") == 3 for s in states):
            break
        await asyncio.sleep(0.1)
    await wait_for_minute_room()
    started = time.monotonic()
    statuses = await burst([g.url for g in three_gateways], name, count, kind)
    elapsed = time.monotonic() - started
    scraped = [await scrape(g.url) for g in three_gateways]
    calls, over_20, over_250 = (sum(admit_calls(metrics)[i] for _, metrics in scraped) for i in (0, 1, 2))
    refusals = [r["e2e_ms"] for g in three_gateways for r in g.requests() if r["tenant"] == name and r["status"] == 429]
    print(f"burst {name}: {count} at once against {limit}/min ({kind}): {statuses.count(200)} admitted, "
          f"{statuses.count(429)} refused, {elapsed:.2f} s; limiter calls so far {calls:.0f}, over 20 ms "
          f"{over_20:.0f}, over 250 ms {over_250:.0f}; slowest refusal {max(refusals, default=0):.0f} ms")
    assert set(statuses) <= {200, 429}, sorted(set(statuses))
    assert statuses.count(200) == limit
    for ready, metrics in scraped:
        assert (ready["redis"], ready["limits"], ready["replicas"]) == ("up", "global", 3)
        assert local_decisions(metrics) == 0  # no call was treated as an outage


async def test_a_slow_redis_is_not_an_outage(start_emulator: StartEmulator, start_app: StartApp,
                                             redis_url: str) -> None:
    """One gateway, limit spent, then a burst while Redis answers late (CLIENT PAUSE: alive, answering
    nothing for 300 ms, against a 20 ms budget): the limiter waits for Redis instead of deciding on
    fresh local counters, and Redis is not reported down."""
    emulator = await start_emulator()
    policy = {"tenants": [tenant("slow", 10, "requests")]}
    config = gateway_config([tier("t", [f"{emulator.url}/v1"])], policy=policy, redis_op_timeout_ms=20)
    gateway = [await start_app(create_app(config, redis_url=redis_url))]
    spent = [(await burst(gateway, "slow", 1, "requests"))[0] for _ in range(10)]  # one at a time: all via Redis
    with redis.Redis.from_url(redis_url) as client:
        client.execute_command("CLIENT", "PAUSE", 300, "ALL")
    during = await burst(gateway, "slow", 10, "requests")
    ready, metrics = await scrape(gateway[0])
    assert spent == [200] * 10
    assert during == [429] * 10
    assert ready["redis"] == "up" and local_decisions(metrics) == 0
