"""Fixtures: real servers on loopback (emulators and gateways), stopped when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack

import asyncio

import pytest
import uvloop
from aiohttp import web

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.emulator.faults import FaultConfig
from gateway.emulator.harness import RunningEmulator, serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.local.redis_server import EmbeddedRedis
from gateway.server import running

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Async tests run on asyncio's loop; those marked `both_loops` also on uvloop, which the gateway serves on."""
    return LOOPS if item.get_closest_marker("both_loops") else {"asyncio": LOOPS["asyncio"]}


StartEmulator = Callable[..., Awaitable[RunningEmulator]]
StartGateway = Callable[[GatewayConfig], Awaitable[str]]
StartApp = Callable[[web.Application], Awaitable[str]]


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as exit_stack:
        yield exit_stack


@pytest.fixture
def start_emulator(stack: AsyncExitStack) -> StartEmulator:
    """Start an emulator (profile 'instant' unless told) on a free port; returns it running."""

    async def start(profile: str = "instant", seed: int = 0, faults: FaultConfig | None = None) -> RunningEmulator:
        return await stack.enter_async_context(serve_emulator(get_profile(profile), seed, faults))

    return start


@pytest.fixture
def start_app(stack: AsyncExitStack) -> StartApp:
    async def start(app: web.Application) -> str:
        return await stack.enter_async_context(running(app))

    return start


@pytest.fixture
def start_gateway(start_app: StartApp) -> StartGateway:
    """Start a gateway for `config` on a free port; returns its base URL (add /v1 for clients)."""

    async def start(config: GatewayConfig) -> str:
        return await start_app(create_app(config))

    return start


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One real Redis server (the embedded default) for the session."""
    with EmbeddedRedis() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    """The session's Redis, emptied for this test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


def v1(urls: Sequence[str]) -> list[str]:
    return [f"{url}/v1" for url in urls]
