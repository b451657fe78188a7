"""The tenant's output cap ends the client's stream with finish_reason "length" and cancels the upstream."""

import asyncio
from typing import Any

from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.testing import TEST_API_KEY, content, gateway_config, scripted_upstream, tier
from tests.conftest import StartApp, StartEmulator


def capped(base: GatewayConfig, **cap: Any) -> GatewayConfig:
    data = base.policy.model_dump()
    data["tenants"] = [{**data["tenants"][0], "output_cap": cap}]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))


async def test_a_char_cap_ends_the_stream_and_cancels_the_backend(start_emulator: StartEmulator,
                                                                  start_app: StartApp) -> None:
    emulator = await start_emulator("int4")  # real decode pacing: the backend is still decoding at the cap
    url = await start_app(create_app(capped(gateway_config([tier("t", [f"{emulator.url}/v1"])]), chars=40)))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(
            model="t", messages=[{"role": "user", "content": "write a long essay"}], max_tokens=1000, stream=True,
            extra_body={"ignore_eos": True})
        chunks = [chunk async for chunk in stream]
        for _ in range(50):
            if emulator.engine.stats.cancelled:
                break
            await asyncio.sleep(0.02)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 40
    assert chunks[-1].choices[0].finish_reason == "length"
    assert emulator.engine.stats.cancelled == 1 and emulator.engine.num_running == 0
    line = next(e for e in logs if e["event"] == "request")
    assert line["output_capped"] and line["finish_reason"] == "length" and line["outcome"] == "ok"
    assert 0 < line["completion_tokens"] < 1000


async def test_a_token_cap_holds_even_when_the_backend_ignores_max_tokens(start_app: StartApp) -> None:
    upstream = await start_app(scripted_upstream([content(f"w{i} ") for i in range(20)] + [b"data: [DONE]\n\n"]))
    url = await start_app(create_app(capped(gateway_config([tier("t", [f"{upstream}/v1"])]), tokens=3)))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_API_KEY)
    stream = await client.chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}],
                                                  stream=True)
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "w0 w1 w2 "
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_a_char_cap_trims_a_non_streamed_answer(start_emulator: StartEmulator, start_app: StartApp) -> None:
    emulator = await start_emulator()
    url = await start_app(create_app(capped(gateway_config([tier("t", [f"{emulator.url}/v1"])]), chars=15)))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_API_KEY)
    answer = await client.chat.completions.create(model="t", messages=[{"role": "user", "content": "x"}],
                                                  max_tokens=50, extra_body={"ignore_eos": True})
    assert len(answer.choices[0].message.content or "") == 15
    assert answer.choices[0].finish_reason == "length"
