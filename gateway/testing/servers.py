"""Servers in process: an emulator and a gateway on free loopback ports (names for the existing harness),
and `wait_ready` for servers started some other way (a subprocess, a container)."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gateway.app import create_app
from gateway.emulator.faults import FaultConfig
from gateway.emulator.harness import RunningEmulator, serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.server import running

__all__ = ["FaultConfig", "RunningEmulator", "create_app", "get_profile", "running", "serve_emulator", "wait_ready"]


async def wait_ready(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0, every_s: float = 0.05) -> None:
    """Poll `{url}/readyz` until it answers 200; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            async with session.get(f"{url}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(every_s)
    raise AssertionError(f"{url} was not ready within {timeout_s:g} s")
