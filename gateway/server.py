"""Run aiohttp applications: on a port (0 picks a free one), until a signal, on uvloop."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web


async def start(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, int]:
    """Start `app`; returns its runner and the port it listens on. Client disconnects cancel handlers."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
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
    """An event set by SIGINT or SIGTERM (installed on the running loop)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def serve_until_signal(app: web.Application, host: str, port: int, stop: asyncio.Event | None = None) -> None:
    """Serve until SIGINT or SIGTERM (or `stop` is set), then shut down cleanly."""
    stop = stop or stop_on_signals()
    runner, _ = await start(app, host, port)
    gc.freeze()  # what start-up allocated is long-lived: keep it out of every collection
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop."""
    import uvloop

    uvloop.run(main)
