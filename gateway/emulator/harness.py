"""`serve_emulator`: run an emulator on a free loopback port for tests and benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from .engine import Engine
from .faults import FaultConfig
from .handlers import ENGINE_KEY
from .profiles import Profile
from .server import create_emulator_app


@dataclass(frozen=True, slots=True)
class RunningEmulator:
    url: str  # e.g. http://127.0.0.1:43123 (append /v1 for an OpenAI base_url)
    engine: Engine


@asynccontextmanager
async def serve_emulator(
    profile: Profile, seed: int = 0, faults: FaultConfig | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[RunningEmulator]:
    """Start the emulator on `host`, port 0, with handler cancellation; stop it on exit."""
    app = create_emulator_app(profile, seed, faults)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0)
        await site.start()
        h, port = runner.addresses[0][:2]
        yield RunningEmulator(f"http://{h}:{port}", app[ENGINE_KEY])
    finally:
        await runner.cleanup()
