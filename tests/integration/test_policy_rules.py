"""Each policy rule and its error code, through the gateway to an emulator."""

import hashlib
from typing import Any

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.emulator.harness import RunningEmulator
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}


def policy_with(base: GatewayConfig, **tenant: Any) -> GatewayConfig:
    data = base.policy.model_dump()
    data["tenants"] = [{**data["tenants"][0], **tenant}]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))


async def gateway(start_emulator: StartEmulator, start_app: StartApp, redis_url: str | None = None,
                  **tenant: Any) -> tuple[str, RunningEmulator]:
    emulator = await start_emulator()
    base = gateway_config([tier("small", [f"{emulator.url}/v1"]), tier("large", [f"{emulator.url}/v1"])])
    return await start_app(create_app(policy_with(base, **tenant), redis_url=redis_url)), emulator


async def post(url: str, **body: Any) -> tuple[int, dict[str, Any], Any]:
    payload = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], **body}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=payload, headers=AUTH) as response:
            return response.status, orjson.loads(await response.read()), response.headers


async def test_max_tokens_is_clamped_by_default(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url, emulator = await gateway(start_emulator, start_app, max_tokens={"default": 4, "maximum": 6})
    status, answer, _ = await post(url, max_tokens=50, ignore_eos=True)
    assert status == 200 and answer["usage"]["completion_tokens"] == 6
    status, answer, _ = await post(url, ignore_eos=True)
    assert answer["usage"]["completion_tokens"] == 4  # the default


async def test_max_tokens_over_the_cap_is_rejected_in_reject_mode(start_emulator: StartEmulator,
                                                                  start_app: StartApp) -> None:
    url, _ = await gateway(start_emulator, start_app,
                           max_tokens={"default": 4, "maximum": 6, "on_exceed": "reject"})
    status, answer, _ = await post(url, max_completion_tokens=7)
    assert status == 400
    assert answer["error"]["param"] == "max_completion_tokens" and answer["error"]["code"] == "max_tokens_exceeded"


async def test_a_prompt_over_the_size_limit_gets_413(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url, emulator = await gateway(start_emulator, start_app, max_prompt_chars=10)
    status, answer, _ = await post(url, messages=[{"role": "user", "content": "x" * 11}])
    assert status == 413 and answer["error"]["param"] == "messages" and answer["error"]["code"] == "prompt_too_large"
    assert emulator.engine.stats.received == 0


async def test_a_tier_the_tenant_may_not_use_gets_403(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url, _ = await gateway(start_emulator, start_app, allowed_tiers=["small"])
    status, answer, _ = await post(url, model="large")
    assert status == 403 and answer["error"]["param"] == "model" and answer["error"]["code"] == "tier_not_allowed"
    assert (await post(url, model="small"))[0] == 200


async def test_the_output_cap_in_tokens_stops_the_backend(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url, _ = await gateway(start_emulator, start_app, output_cap={"tokens": 3})
    status, answer, _ = await post(url, max_tokens=100, ignore_eos=True)
    assert status == 200 and answer["usage"]["completion_tokens"] == 3
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_extra_stop_sequences_reach_the_backend(start_app: StartApp, start_gateway: Any) -> None:
    from aiohttp import web

    seen: list[dict[str, Any]] = []

    async def backend(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                               "finish_reason": "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", backend)
    upstream = await start_app(app)
    base = gateway_config([tier("small", [f"{upstream}/v1"])])
    url = await start_app(create_app(policy_with(base, stop=["\nUser:", "###"])))
    await post(url, stop="END")
    assert seen[0]["stop"] == ["END", "\nUser:", "###"]


async def test_requests_per_minute_with_retry_after(start_emulator: StartEmulator, start_app: StartApp,
                                                    redis_url: str) -> None:
    url, _ = await gateway(start_emulator, start_app, redis_url, rate_limit={"requests_per_min": 3})
    with capture_logs() as logs:
        results = [await post(url, max_tokens=1) for _ in range(5)]
    assert [status for status, _, _ in results] == [200, 200, 200, 429, 429]
    status, answer, headers = results[3]
    assert answer["error"]["code"] == "rate_limit_requests" and 1 <= int(headers["Retry-After"]) <= 60
    rejected = [e for e in logs if e["event"] == "request" and e["status"] == 429]
    assert len(rejected) == 2 and all(e["cost_usd"] == 0 for e in rejected)


async def test_tokens_per_minute(start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    import asyncio

    # charged on admission: 5 chars // 4 + 15 = 16; booked after: 11 prompt + 15 completion = 26
    url, _ = await gateway(start_emulator, start_app, redis_url, rate_limit={"tokens_per_min": 60})
    statuses = []
    for _ in range(4):
        statuses.append((await post(url, max_tokens=15, ignore_eos=True))[0])
        await asyncio.sleep(0.05)
    assert statuses == [200, 200, 429, 429]  # 26 + 16 <= 60; 52 + 16 > 60


async def test_the_daily_budget_stops_a_tenant(start_emulator: StartEmulator, start_app: StartApp,
                                               redis_url: str) -> None:
    import asyncio

    # prices: 1 USD / 2 USD per 1M tokens; a budget of 1e-5 USD is spent after a few requests
    import math

    url, _ = await gateway(start_emulator, start_app, redis_url, daily_budget_usd=0.00001)
    statuses = []
    with capture_logs() as logs:
        for _ in range(8):
            statuses.append((await post(url, max_tokens=5, ignore_eos=True))[0])
            await asyncio.sleep(0.05)  # the spend is booked after the answer
    costs = [e["cost_usd"] for e in logs if e["event"] == "request" and e["status"] == 200]
    assert costs and all(c == pytest.approx(costs[0]) and c > 0 for c in costs)
    # the whole cost of each answer is booked: admitted while the spend so far is under the budget
    served = math.ceil(0.00001 / costs[0])
    assert statuses == [200] * served + [429] * (8 - served), (statuses, costs[0])
    status, answer, headers = await post(url, max_tokens=1)
    assert answer["error"]["code"] == "budget_exhausted" and int(headers["Retry-After"]) > 0
