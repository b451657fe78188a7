"""A real client behind RedisGuard while the server is killed and restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.cache.connection import RedisClient, connect
from gateway.cache.guard import RedisGuard
from gateway.local.redis_server import EmbeddedRedis


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as running:
        yield running


@pytest.fixture
async def client(server: EmbeddedRedis) -> AsyncIterator[RedisClient]:
    redis_client = connect(server.url)
    yield redis_client
    await redis_client.aclose()


async def test_the_client_reconnects_by_itself_after_a_restart(server: EmbeddedRedis, client: RedisClient) -> None:
    await client.set("k", "v")
    server.kill()
    server.restart()  # data is gone (no persistence); the pooled connection is dead
    assert await client.get("k") is None
    assert await client.set("k", "again") and await client.get("k") == b"again"


async def test_guard_fails_fast_skips_while_down_and_recovers(server: EmbeddedRedis, client: RedisClient) -> None:
    registry = CollectorRegistry()
    # a backoff long enough that restarting the server on a loaded machine stays inside it
    guard = RedisGuard(client, op_timeout_s=0.05, down_backoff_s=2.0, registry=registry, down_after_s=0.0)
    calls = 0

    def ping() -> Awaitable[bool]:
        nonlocal calls
        calls += 1
        return client.ping()

    assert await guard.run("ping", ping) is True
    server.kill()
    start = time.perf_counter()
    assert await guard.run("ping", ping) is None
    assert time.perf_counter() - start < 1.0 and not guard.up  # did not block (a refused connect, not a wait)
    start = time.perf_counter()
    for _ in range(1000):
        assert await guard.run("ping", ping) is None
    assert calls == 2 and time.perf_counter() - start < 1.0  # no connect attempt while backing off (counted)
    server.restart()
    assert await guard.run("ping", ping) is None  # still inside the backoff window
    time.sleep(2.0)
    assert await guard.run("ping", ping) is True and guard.up
    assert registry.get_sample_value("gateway_redis_up") == 1
    assert registry.get_sample_value("gateway_redis_errors_total", {"op": "ping"}) == 1


async def test_a_frozen_server_costs_three_timeouts_then_is_skipped(server: EmbeddedRedis, client: RedisClient) -> None:
    guard = RedisGuard(client, op_timeout_s=0.2, down_backoff_s=0.2, down_after_s=0.0)
    assert await guard.run("ping", client.ping) is True
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)  # accepts nothing, answers nothing: like a black hole
    try:
        start = time.perf_counter()
        for _ in range(3):
            assert await guard.run("ping", client.ping) is None
        assert not guard.up and 0.6 <= time.perf_counter() - start < 3.0  # three timeouts, then no more waits
        tried = []

        def ping() -> Awaitable[bool]:
            tried.append(1)
            return client.ping()

        start = time.perf_counter()
        assert await guard.run("ping", ping) is None and tried == []  # skipped while down: not even called
        assert time.perf_counter() - start < 1.0
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    await asyncio.sleep(0.2)
    assert await guard.run("ping", client.ping, timeout_s=1.0) is True and guard.up
