"""The emulator's aiohttp application and its `gateway emulate` entry point."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import orjson
import structlog
from aiohttp import web

from .engine import Engine
from .faults import FaultConfig
from .handlers import ENGINE_KEY, chat_completions, completions
from .metrics import render_metrics
from .profiles import Profile, get_profile
from .wire import error_response

__all__ = ["ENGINE_KEY", "create_emulator_app", "run_emulator"]


async def _models(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    model = {
        "id": engine.profile.model_name, "object": "model", "created": int(time.time()),
        "owned_by": "emulator", "max_model_len": engine.profile.max_model_len,
    }
    return web.json_response({"object": "list", "data": [model]}, dumps=_dumps)


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=render_metrics(request.app[ENGINE_KEY]),
                        content_type="text/plain", charset="utf-8")


async def _stats(request: web.Request) -> web.Response:
    raw = request.query.get("records")
    records = int(raw) if raw is not None and raw.lstrip("-").isdigit() else None
    return web.json_response(request.app[ENGINE_KEY].snapshot(records), dumps=_dumps)


async def _set_faults(request: web.Request) -> web.Response:
    """Replace the live FaultConfig with the JSON body (fields not given take defaults)."""
    engine = request.app[ENGINE_KEY]
    try:
        config = FaultConfig.from_dict(orjson.loads(await request.read() or b"{}"))
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        return error_response(400, f"bad fault config: {exc}", "invalid_request_error")
    engine.faults.config = config
    return web.json_response(config.to_dict(), dumps=_dumps)


def _dumps(obj: object) -> str:
    return orjson.dumps(obj).decode()


def create_emulator_app(
    profile: Profile, seed: int = 0, faults: FaultConfig | None = None
) -> web.Application:
    """An app serving one emulated backend; its Engine is at `app[ENGINE_KEY]`."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    engine = Engine(profile, seed, faults)
    app[ENGINE_KEY] = engine

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        engine.start()
        yield
        await engine.stop()

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/emulator/stats", _stats)
    app.router.add_post("/emulator/faults", _set_faults)
    return app


async def run_emulator(host: str, port: int, profile_name: str, seed: int) -> None:
    """Serve the named profile on host:port until cancelled (used by `gateway emulate`)."""
    app = create_emulator_app(get_profile(profile_name), seed)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        structlog.get_logger("gateway.emulator").info(
            "emulator_listening", profile=profile_name, seed=seed,
            addresses=[f"{a[0]}:{a[1]}" for a in runner.addresses],
        )
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
