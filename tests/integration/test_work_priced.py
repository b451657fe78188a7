"""Work done is priced (issue 37): a request whose client leaves is priced for what the backend did, the log line
says from what (`priced_from`), and the tenant's token charge is booked for that work, not refunded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
import redis
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.limits.limiter import rate_key
from gateway.limits.window import WindowPosition
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_output_cap_choices import choices_backend

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
LEAVE_S = 1.5  # the client hangs up after this
TOKEN_S = 0.01  # the backend's decode step: 100 tokens a second per output
PROMPT = "hello " * 2000  # 2,000 tokens for the tier's tokenizer (WordPiece: one each)
PRICES = (1.0, 2.0)  # per million tokens, in and out (gateway.testing.tier)


def limited(base: GatewayConfig) -> GatewayConfig:
    data = base.policy.model_dump()
    data["tenants"] = [{**data["tenants"][0], "rate_limit": {"tokens_per_min": 1_000_000}}]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))


async def leave_after(url: str, body: dict[str, Any], seconds: float) -> None:
    """Send `body` and hang up after `seconds`, whatever came."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(seconds):
                async with session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
                    await response.read()


async def request_line(logs: list[dict[str, Any]], count: int) -> dict[str, Any]:
    for _ in range(100):
        lines = [e for e in logs if e["event"] == "request"]
        if len(lines) >= count:
            return lines[count - 1]
        await asyncio.sleep(0.02)
    raise AssertionError(f"no request line {count}")


def booked(redis_url: str) -> int:
    """The tenant's token windows of this minute and the one before (what the limiter charged and booked: a test
    takes seconds, so a charge and its booking may fall either side of a minute's turn; Redis is emptied per test)."""
    tenant = limited(gateway_config([tier("t", ["http://x/v1"])])).policy.tenants[0]
    now = time.time()
    with redis.Redis.from_url(redis_url) as client:
        found = [client.get(rate_key(tenant, "tok", WindowPosition.at(at).index)) for at in (now - 60, now)]
    return sum(int(data or 0) for data in found)


async def wait_booked(redis_url: str, expected: int) -> int:
    """The window once it holds `expected` (booked in the background after the line: the charge on admission is
    there first, then the booking corrects it), or what it holds after 2 s."""
    for _ in range(100):
        if (value := booked(redis_url)) == expected:
            return value
        await asyncio.sleep(0.02)
    return booked(redis_url)


@pytest.mark.parametrize("n", [1, 4])
async def test_a_client_gone_before_a_whole_answer_is_priced_for_the_prompt_and_the_decoding(
        start_app: StartApp, redis_url: str, n: int) -> None:
    upstream = await start_app(choices_backend(token_delay_s=TOKEN_S, tokens=1000))
    config = limited(gateway_config([tier("t", [f"{upstream}/v1"])]))
    url = await start_app(create_app(config, redis_url=redis_url))
    chat = {"model": "t", "max_tokens": 1000}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:  # a stream measures the replica's decode rate (TPOT)
            async with session.post(f"{url}/v1/chat/completions", headers=AUTH, json={
                    **chat, "max_tokens": 20, "stream": True, "messages": [{"role": "user", "content": "warm up"}]}) as response:
                await response.read()
        warm = await request_line(logs, 1)
        await leave_after(url, {**chat, "n": n, "messages": [{"role": "user", "content": PROMPT}]}, LEAVE_S)
        line = await request_line(logs, 2)
    assert warm["tpot_ms"] == pytest.approx(TOKEN_S * 1000, rel=0.5)
    assert (line["status"], line["outcome"], line["stream"]) == (499, "client_disconnected", False)
    assert line["priced_from"] == "estimated_decode_rate"
    assert line["prompt_tokens"] == 2000  # the tier's tokenizer
    # the first token at the replica's predicted TTFT (prefill of ~2,000 tokens), then one per TPOT till the client left
    decoding_s = LEAVE_S - line["predicted_ttft_ms"] / 1000
    assert decoding_s > 0.3
    per_output = line["completion_tokens"] / n
    assert line["completion_tokens"] % n == 0 and per_output == pytest.approx(1 + decoding_s / TOKEN_S, abs=25)
    assert line["cost_usd"] == pytest.approx((2000 * PRICES[0] + line["completion_tokens"] * PRICES[1]) / 1e6)
    work = warm["prompt_tokens"] + warm["completion_tokens"] + line["prompt_tokens"] + line["completion_tokens"]
    assert await wait_booked(redis_url, work) == work  # charged on admission, booked to the work: no refund


async def test_without_a_measured_decode_rate_the_prompt_is_priced(start_app: StartApp, redis_url: str) -> None:
    upstream = await start_app(choices_backend(token_delay_s=TOKEN_S, tokens=1000))
    url = await start_app(create_app(limited(gateway_config([tier("t", [f"{upstream}/v1"])])), redis_url=redis_url))
    with capture_logs() as logs:
        await leave_after(url, {"model": "t", "max_tokens": 1000,
                                "messages": [{"role": "user", "content": PROMPT}]}, 0.3)
        line = await request_line(logs, 1)
    assert (line["status"], line["priced_from"]) == (499, "prompt_only")
    assert (line["prompt_tokens"], line["completion_tokens"]) == (2000, 0)
    assert line["cost_usd"] == pytest.approx(2000 * PRICES[0] / 1e6)
    assert await wait_booked(redis_url, 2000) == 2000


async def test_a_stream_left_before_its_first_byte_is_priced_for_its_prompt(start_app: StartApp) -> None:
    upstream = await start_app(choices_backend(token_delay_s=TOKEN_S, first_byte_delay_s=2.0))
    url = await start_app(create_app(gateway_config([tier("t", [f"{upstream}/v1"])])))
    with capture_logs() as logs:
        await leave_after(url, {"model": "t", "stream": True, "messages": [{"role": "user", "content": PROMPT}]},
                          0.3)
        line = await request_line(logs, 1)
    assert (line["status"], line["priced_from"], line["prompt_tokens"], line["completion_tokens"]) == (
        499, "prompt_only", 2000, 0)
    assert line["cost_usd"] == pytest.approx(2000 * PRICES[0] / 1e6)


async def test_a_stream_left_midway_is_priced_for_the_tokens_read(start_emulator: StartEmulator,
                                                                  start_app: StartApp) -> None:
    emulator = await start_emulator("int4")
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])])))
    body = {"model": "t", "stream": True, "max_tokens": 2000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "hello there"}]}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
                async for _ in response.content.iter_any():
                    break
        line = await request_line(logs, 1)
    assert (line["status"], line["priced_from"], line["usage_source"]) == (499, "counted", "counted")
    assert line["prompt_tokens"] > 0 and 0 < line["completion_tokens"] < 2000 and line["cost_usd"] > 0
