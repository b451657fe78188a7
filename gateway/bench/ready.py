"""Waiting for a gateway the bench started: until /readyz says every backend is ready."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gateway.testing import wait_ready


async def gateway_ready(url: str, timeout_s: float = 120.0) -> None:
    """/readyz answers 200 and says every backend is ready (its first health probe may precede a server's start:
    that replica is out of the ranking until the next probe)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, url, timeout_s=timeout_s, every_s=0.5)
        while time.monotonic() < deadline:
            async with session.get(f"{url}/readyz") as response:
                if (await response.json()).get("backends") == "ready":
                    return
            await asyncio.sleep(0.5)
    raise AssertionError(f"{url}: not every backend ready within {timeout_s:g} s")
