"""Rate limits hold across two gateway processes sharing one Redis, and fall back to a conservative
local share (the limit divided by the replicas the heartbeats counted) when Redis is stopped."""

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from redis.asyncio import Redis

from gateway.cache.guard import RedisGuard
from gateway.limits.replicas import Replicas
from gateway.local.redis_server import EmbeddedRedis, free_ports
from gateway.testing import routes_yaml, wait_ready
from tests.conftest import StartEmulator

KEY, LATER_KEY = "sk-limits", "sk-later"


def gateway_process(tmp: Path, backend: str, redis_url: str, port: int) -> subprocess.Popen[bytes]:
    (tmp / "routes.yaml").write_text(routes_yaml(f"{backend}/v1", extra="redis: {op_timeout_ms: 250}"))
    (tmp / "policy.yaml").write_text(f"""
default_tier: t
rate_limit: {{requests_per_min: 4}}
tenants:
  - {{name: shared, api_key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}}}
  - {{name: later, api_key_sha256: {hashlib.sha256(LATER_KEY.encode()).hexdigest()}}}
""")
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--routes", str(tmp / "routes.yaml"),
                             "--policies", str(tmp / "policy.yaml"), "--port", str(port), "--redis-url", redis_url,
                             "--log-file", str(tmp / f"log-{port}")], stderr=subprocess.DEVNULL)


@pytest.fixture
def redis_alone() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


async def ask(session: aiohttp.ClientSession, url: str, key: str = KEY) -> int:
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        await response.read()
        return response.status


async def readiness(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/readyz") as response:
        return dict(await response.json())


async def local_decisions(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gateway_limits_local_decisions_total{"))


async def test_limits_are_global_then_a_local_share_when_redis_stops(
        tmp_path: Path, start_emulator: StartEmulator, redis_alone: EmbeddedRedis) -> None:
    emulator = await start_emulator()
    ports = free_ports(2)
    processes = []
    for i, port in enumerate(ports):
        (tmp_path / str(i)).mkdir()
        processes.append(gateway_process(tmp_path / str(i), emulator.url, redis_alone.url, port))
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        async with aiohttp.ClientSession() as session:
            for url in urls:
                await wait_ready(session, url)
            for _ in range(100):  # the heartbeats: each gateway learns that there are two
                if [(await readiness(session, url)).get("replicas") for url in urls] == [2, 2]:
                    break
                await asyncio.sleep(0.1)
            shared = [await ask(session, urls[i % 2]) for i in range(8)]
            redis_alone.stop()
            local_a = [await ask(session, urls[0], LATER_KEY) for _ in range(3)]
            local_b = [await ask(session, urls[1], LATER_KEY) for _ in range(3)]
            states = [await readiness(session, url) for url in urls]
            decisions = [await local_decisions(session, url) for url in urls]
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    assert shared.count(200) == 4 and shared.count(429) == 4  # one budget for both gateways
    # Redis down: each gateway admits its share, 4 / 2 replicas, so the two together stay within 4
    assert local_a == [200, 200, 429] and local_b == [200, 200, 429]
    assert [(s["redis"], s["limits"], s["replicas"]) for s in states] == [("down", "local", 2)] * 2
    assert decisions == [3.0, 3.0]
    for i in range(2):
        events = [orjson.loads(line) for line in (tmp_path / str(i) / f"log-{ports[i]}").read_bytes().splitlines()]
        [warning] = [e for e in events if e.get("event") == "limits_local"]
        assert (warning["reason"], warning["replicas"]) == ("redis_down", 2)


async def test_heartbeats_count_the_live_replicas(redis_url: str) -> None:
    guards = [RedisGuard(Redis.from_url(redis_url), op_timeout_s=1.0) for _ in range(3)]
    replicas = [Replicas(guard, lambda: 1, every_s=1.0) for guard in guards]
    for each in replicas:
        await each.beat()
    await replicas[0].beat()
    assert (replicas[0].count, replicas[1].count) == (3, 2)  # each knows what it saw at its last beat
    await replicas[2].leave()
    await replicas[0].beat()
    assert replicas[0].count == 2
    stop = asyncio.Event()
    task = asyncio.create_task(replicas[1].run(stop))
    await asyncio.sleep(0.05)  # its first beat goes at once
    stop.set()
    await task
    assert replicas[1].seen == 2
    for guard in guards:
        await guard.client.aclose()
