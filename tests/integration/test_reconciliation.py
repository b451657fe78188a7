"""Reconciliation: a mixed run's logged cost equals, to the cent, an independent sum over the tokens the
emulators actually produced, priced from the table; and every request sent has its log line."""

import asyncio
import hashlib
from decimal import Decimal
from typing import Any

import aiohttp
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.emulator.faults import FaultConfig
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

# 1 token = $0.001 in, $0.002 out: a miscounted token moves the total by a tenth of a cent or more
PRICES = {"small": (1000.0, 2000.0), "large": (3000.0, 6000.0)}
CAPPED_KEY = "sk-capped"


async def send(session: aiohttp.ClientSession, url: str, key: str, abort_after: int | None = None,
               **body: Any) -> None:
    payload = {"messages": [{"role": "user", "content": f"question {body.pop('n', 0)} about queues"}], **body}
    async with session.post(f"{url}/v1/chat/completions", json=payload,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        if abort_after is None:
            await response.read()
            return
        seen = 0
        async for _ in response.content.iter_any():
            seen += 1
            if seen >= abort_after:
                return  # hang up mid-stream


async def test_logged_costs_reconcile_with_the_tokens_produced(start_emulator: StartEmulator, start_app: StartApp,
                                                               redis_url: str) -> None:
    small, large = await start_emulator("fp16", seed=1), await start_emulator("fp16", seed=2)  # real pacing
    broken = await start_emulator(faults=FaultConfig(error_rate=1.0))
    base = gateway_config([tier("small", [f"{small.url}/v1"], input_per_mtok=1000, output_per_mtok=2000,
                                tokenizer="emulator"),
                           tier("large", [f"{large.url}/v1"], precision="fp16", input_per_mtok=3000,
                                output_per_mtok=6000, tokenizer="emulator"),
                           tier("broken", [f"{broken.url}/v1"])])
    data = base.policy.model_dump()
    data["tenants"] = [*data["tenants"], {"name": "capped", "output_cap": {"tokens": 5},
                                          "api_key_sha256": hashlib.sha256(CAPPED_KEY.encode()).hexdigest()}]
    config = GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))
    url = await start_app(create_app(config, redis_url=redis_url))
    sent = 0
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            for n in range(4):  # misses, then hits for the same deterministic requests
                for model in ("small", "large"):
                    await send(session, url, TEST_API_KEY, model=model, n=n % 2, max_tokens=6, temperature=0)
                    sent += 1
                    await asyncio.sleep(0.02)
            for n in range(3):  # streams, whole and aborted
                await send(session, url, TEST_API_KEY, model="large", n=10 + n, max_tokens=12, stream=True,
                           ignore_eos=True)
                await send(session, url, TEST_API_KEY, abort_after=4, model="small", n=20 + n, max_tokens=400,
                           stream=True, ignore_eos=True)
                sent += 2
            for n in range(2):  # output-capped streams: the backend is cancelled at the cap
                await send(session, url, CAPPED_KEY, model="small", n=30 + n, max_tokens=400, stream=True,
                           ignore_eos=True)
                sent += 1
            for body in ({"model": "broken"}, {"model": "nope"}, {"model": "small", "max_tokens": -1}):
                await send(session, url, TEST_API_KEY, **body)
                sent += 1
            await send(session, url, "sk-wrong", model="small")
            sent += 1
        await asyncio.sleep(0.3)  # aborted streams: let the emulators record their cancellations
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert len(lines) == sent
    logged = sum(Decimal(repr(line["cost_usd"])) for line in lines)
    produced = Decimal(0)
    for name, emulator in (("small", small), ("large", large)):
        price_in, price_out = (Decimal(repr(p)) / 1_000_000 for p in PRICES[name])
        for record in emulator.engine.stats.records:
            produced += record.prompt_tokens * price_in + record.sent_tokens * price_out
    assert abs(logged - produced) < Decimal("0.005"), (logged, produced)
    outcomes = {line["outcome"] for line in lines}
    assert outcomes == {"ok", "client_disconnected", "upstream_error", "rejected"}
    assert sum(line["cache"] == "hit" for line in lines) >= 4
    assert sum(bool(line["output_capped"]) for line in lines) == 2
