"""Run aiohttp applications: on a port (0 picks a free one), until a signal, on uvloop.

Shutdown drains: on SIGTERM (or SIGINT) the listening socket closes (new connections are refused),
`Lifecycle.draining` turns /readyz to 503, requests in flight get up to the drain timeout to finish,
then what is left is cancelled (their handlers still run their `finally`: the request is logged),
and only then are the app's resources closed.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from gateway.edge.server import EdgeRunner

DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Young collections every 20,000 net allocations instead of 700: a request's objects die by reference
# count, so a collection finds little, and 700 meant several per request (docs/BENCHMARKS.md, hot path).
GC_THRESHOLDS = (20_000, 20, 20)

log = structlog.get_logger("gateway.server")


@dataclass(slots=True)
class Lifecycle:
    """Where the server is in its life; /readyz reads it."""

    draining: bool = False


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)


async def start(app: web.Application, host: str = "127.0.0.1", port: int = 0,
                drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> tuple[web.AppRunner, int]:
    """Start `app`; returns its runner and the port it listens on. Client disconnects cancel handlers;
    `runner.cleanup()` waits up to `drain_timeout_s` for requests in flight."""
    if LIFECYCLE not in app:
        app[LIFECYCLE] = Lifecycle()
    runner = EdgeRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=drain_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)


@asynccontextmanager
async def running(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `app` on a free loopback port for the block; yields its base URL."""
    runner, port = await start(app, host)
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (installed on the running loop). SIGHUP, whose default action ends the
    process without a drain, is logged and ignored until the config reloader (when the files are watched) takes
    it over: no SIGHUP ever kills the gateway."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _sighup_ignored)
    return stop


def _sighup_ignored() -> None:
    log.warning("sighup_ignored", reason="no config files watched: nothing to reload")


async def serve_until_signal(app: web.Application, host: str, port: int, stop: asyncio.Event | None = None,
                             drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S) -> None:
    """Serve until SIGINT or SIGTERM (or `stop` is set), then drain and shut down cleanly."""
    stop = stop or stop_on_signals()
    runner, _ = await start(app, host, port, drain_timeout_s)
    gc.freeze()  # what start-up allocated is long-lived: keep it out of every collection
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        await stop.wait()
    finally:
        await drain(runner, drain_timeout_s)


async def drain(runner: web.AppRunner, timeout_s: float) -> None:
    """Refuse new connections, mark the app draining, wait for requests in flight (cancelled past
    `timeout_s`), then close the app's resources."""
    runner.app[LIFECYCLE].draining = True
    started = time.monotonic()
    log.info("draining", in_flight=in_flight(runner), drain_timeout_s=timeout_s)
    deadline = asyncio.get_running_loop().call_later(
        timeout_s, lambda: log.warning("drain_deadline", cancelled=in_flight(runner)))
    try:
        await runner.cleanup()  # stops the sites first, then waits per connection up to the timeout
    finally:
        deadline.cancel()
    log.info("drained", seconds=round(time.monotonic() - started, 3))


def in_flight(runner: web.AppRunner) -> int:
    """Requests being handled now (best effort: aiohttp keeps that flag per connection, privately)."""
    connections = runner.server.connections if runner.server is not None else []
    return sum(1 for conn in connections if getattr(conn, "_request_in_progress", False))


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop."""
    import uvloop

    uvloop.run(main)
