"""Fixtures: real servers on loopback (emulators and gateways), stopped when the test ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack

import asyncio
import gc
import os

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


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """The test process's heap kept out of the cyclic GC for this test, as the server's `gc.freeze()` keeps what
    its start-up allocated. After the suite's earlier tests it holds ~1M objects: one gen-2 pass over them stalled
    the event loop 1.2 s in CI, past a 1 s Redis budget of the gateways under test (a lost cache hit the gateway
    never caused). Frozen objects go back to the collector when the test ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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


# -- no silent skips (issue 42) ------------------------------------------------------------------------------------
# In CI (CI=true, as .ci/run runs) a skipped test is a failure, unless its skip is one README's "Optional tests"
# documents: each entry is (test file, words of the skip's reason). `make test` installs what every other test
# needs (llama.cpp, Chromium, wrk, nginx and openssl, kubectl, the train extra).
OPTIONAL_SKIPS = (
    ("tests/integration/test_nginx_upstream.py", "no early_hints directive"),  # Debian's nginx is 1.22
    ("tests/integration/test_otlp_collector.py", "no IPv6 loopback"),  # a machine or container without ::1
)


def _documented(path: str, reason: str) -> bool:
    return any(path == file and words in reason for file, words in OPTIONAL_SKIPS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or os.environ.get("CI", "").lower() not in ("true", "1") or hasattr(report, "wasxfail"):
        return
    path, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, str(report.longrepr))
    relative = item.nodeid.split("::")[0]
    if _documented(relative, str(reason)):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI: {reason} ({path}). A test that cannot run here fails in CI: install what it "
                       "needs from the Makefile, or document the skip in README \"Optional tests\" and "
                       "tests/conftest.py OPTIONAL_SKIPS")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """The same for a whole module skipped while collected (a module-level `pytest.importorskip`)."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()
    if not report.skipped or os.environ.get("CI", "").lower() not in ("true", "1"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if _documented(report.nodeid.split("::")[0], str(reason)):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI while collected: {reason}. Install what it needs from the Makefile, or "
                       "document the skip in README \"Optional tests\" and tests/conftest.py OPTIONAL_SKIPS")
