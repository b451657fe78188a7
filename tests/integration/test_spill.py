"""Spill under load end to end (issue 39): two emulator tiers, the large one saturated (one slot, a long answer in
flight); model 'auto' routed to it goes to the small tier, and the header, the log line and the metric say so."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, Tier
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

HARD = "a hard question"  # the scorer puts it in the large tier's band


def body(max_tokens: int) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": HARD}], "max_tokens": max_tokens,
            "stream": True}


async def ask(url: str, max_tokens: int = 4) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body(max_tokens),
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            await response.read()
            return response.status, dict(response.headers)


async def spills(url: str) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
    match = re.search(r'^gateway_spills_total\{from_tier="large",to_tier="small"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def config(small_url: str, large_url: str, spill: bool) -> GatewayConfig:
    small = tier("small", [f"{small_url}/v1"])
    large = Tier.model_validate({**tier("large", [f"{large_url}/v1"]).model_dump(), "slots_per_replica": 1})
    policy: dict[str, Any] = {"routing": {"bands": [{"tier": "small", "below": 0.5}, {"tier": "large"}]}}
    if spill:
        policy["spill"] = {"ttft_slo_ms": 300}
    return gateway_config([small, large], policy=policy)


async def saturated(start_emulator: StartEmulator, start_app: StartApp, spill: bool) -> tuple[str, asyncio.Task[Any]]:
    """A gateway whose large tier learned a long answer's time and now runs one (its only slot taken)."""
    small, large = await start_emulator("instant"), await start_emulator("fp16")
    url = await start_app(create_app(config(small.url, large.url, spill), TableScorer({HARD: 0.9})))
    status, headers = await ask(url, max_tokens=24)  # idle: the large tier serves; ~0.8 s end to end learned
    assert status == 200 and headers["x-gateway-tier"] == "large" and "x-gateway-spilled-from" not in headers
    holder = asyncio.create_task(ask(url, max_tokens=24))
    await asyncio.sleep(0.15)  # in flight: the next one would queue behind ~0.8 s
    return url, holder


async def test_a_saturated_tier_spills_with_header_log_and_metric(start_emulator: StartEmulator,
                                                                  start_app: StartApp) -> None:
    url, holder = await saturated(start_emulator, start_app, spill=True)
    with capture_logs() as logs:
        status, headers = await ask(url)
    await holder
    assert status == 200 and headers["x-gateway-tier"] == "small"
    assert headers["x-gateway-spilled-from"] == "large"
    line = next(entry for entry in logs if entry.get("event") == "request")
    assert line["tier"] == "small" and line["spilled_from"] == "large"
    spill = line["spill"]
    assert spill["from"]["tier"] == "large" and spill["from"]["ttft_ms"] > 300
    assert spill["to"]["tier"] == "small" and spill["to"]["ttft_ms"] <= 300
    assert await spills(url) == 1


async def test_without_spill_the_request_waits_for_the_saturated_tier(start_emulator: StartEmulator,
                                                                      start_app: StartApp) -> None:
    url, holder = await saturated(start_emulator, start_app, spill=False)
    with capture_logs() as logs:
        status, headers = await ask(url)
    await holder
    assert status == 200 and headers["x-gateway-tier"] == "large" and "x-gateway-spilled-from" not in headers
    line = next(entry for entry in logs if entry.get("event") == "request")
    assert line["spilled_from"] is None and line["spill"] is None
    assert await spills(url) == 0
