"""Rate limits hold across two gateway processes sharing one Redis, and fall back to local limits
when Redis is stopped."""

import asyncio
import hashlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.local.redis_server import EmbeddedRedis, free_port
from gateway.testing import routes_yaml
from tests.conftest import StartEmulator

KEY = "sk-limits"


def gateway_process(tmp: Path, backend: str, redis_url: str, port: int) -> subprocess.Popen[bytes]:
    (tmp / "routes.yaml").write_text(routes_yaml(f"{backend}/v1", extra="redis: {op_timeout_ms: 250}"))
    (tmp / "policy.yaml").write_text(f"""
default_tier: t
rate_limit: {{requests_per_min: 4}}
tenants: [{{name: shared, api_key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}}}]
""")
    return subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--routes", str(tmp / "routes.yaml"),
                             "--policies", str(tmp / "policy.yaml"), "--port", str(port), "--redis-url", redis_url,
                             "--log-file", str(tmp / f"log-{port}")], stderr=subprocess.DEVNULL)


@pytest.fixture
def redis_alone() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as server:
        yield server


async def wait_ready(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        try:
            async with session.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never became ready")


async def ask(session: aiohttp.ClientSession, url: str) -> int:
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as response:
        await response.read()
        return response.status


async def test_limits_are_global_then_local_when_redis_stops(tmp_path: Path, start_emulator: StartEmulator,
                                                             redis_alone: EmbeddedRedis) -> None:
    emulator = await start_emulator()
    ports = [free_port(), free_port()]
    processes = []
    for i, port in enumerate(ports):
        (tmp_path / str(i)).mkdir()
        processes.append(gateway_process(tmp_path / str(i), emulator.url, redis_alone.url, port))
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        async with aiohttp.ClientSession() as session:
            for url in urls:
                await wait_ready(session, url)
            shared = [await ask(session, urls[i % 2]) for i in range(8)]
            redis_alone.stop()
            local_a = [await ask(session, urls[0]) for _ in range(5)]
            local_b = [await ask(session, urls[1]) for _ in range(5)]
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)
    assert shared.count(200) == 4 and shared.count(429) == 4  # one budget for both gateways
    assert local_a == [200] * 4 + [429] and local_b == [200] * 4 + [429]  # each process on its own
