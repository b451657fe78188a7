"""The exact cache through the gateway (real Redis, an emulator behind): two requests that differ only in one
output-changing field never share a cached answer; the same request twice does. Tested through behaviour over
HTTP (the backend's request count, `x-gateway-cache`, the answer's length), not through how the key is made."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.app import create_app
from gateway.emulator.harness import RunningEmulator
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
BASE: dict[str, Any] = {"model": "t", "messages": [{"role": "user", "content": "What is a KV cache?"}],
                        "seed": 7, "ignore_eos": True}


async def gateway(start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> tuple[str, RunningEmulator]:
    emulator = await start_emulator()
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])]), redis_url=redis_url))
    return url, emulator


async def ask(url: str, body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(x-gateway-cache, the answer); waits for the background store of a miss."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
            assert response.status == 200, await response.text()
            answer = orjson.loads(await response.read())
            cache = response.headers.get("x-gateway-cache")
    await asyncio.sleep(0.1)  # a miss is stored after its answer, in the background
    return cache, answer


# (field, first value, second value): each pair must be two cache entries
FIELDS = [("max_tokens", 3, 8), ("max_completion_tokens", 3, 8), ("seed", 7, 8), ("temperature", 0.0, 0.5)]


@pytest.mark.parametrize(("field", "first", "second"), FIELDS, ids=[f[0] for f in FIELDS])
async def test_requests_differing_only_in_one_output_field_do_not_share_a_cached_answer(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str, field: str, first: Any,
        second: Any) -> None:
    """Pins: max_tokens, max_completion_tokens, seed and temperature are each part of what makes two requests
    the same cached answer (a key without one would replay a 3-token answer to a request for 8)."""
    url, emulator = await gateway(start_emulator, start_app, redis_url)
    length = {} if field in ("max_tokens", "max_completion_tokens") else {"max_tokens": 5}
    one = {**BASE, **length, field: first}
    other = {**BASE, **length, field: second}
    assert (await ask(url, one))[0] is None  # a miss, stored
    assert (await ask(url, one))[0] == "hit"  # the same request: the cache works here
    cache, answer = await ask(url, other)
    assert cache is None, f"a request with {field}={second!r} was answered from the cache of {field}={first!r}"
    assert emulator.engine.stats.received == 2
    if field in ("max_tokens", "max_completion_tokens"):  # its own answer, of its own length
        assert answer["usage"]["completion_tokens"] == second
    again, _ = await ask(url, other)
    assert again == "hit" and emulator.engine.stats.received == 2  # and it was stored under its own entry
