"""The exact response cache against a real Redis: hits replay as JSON or SSE, only good answers are stored."""

import asyncio

import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.state import GATEWAY
from gateway.config import GatewayConfig, PolicyConfig
from gateway.emulator.faults import FaultConfig
from gateway.emulator.harness import RunningEmulator
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

MESSAGES = [{"role": "user", "content": "What is a KV cache?"}]
OTHER_KEY = "sk-other"


def with_second_tenant(config: GatewayConfig, **cache: object) -> GatewayConfig:
    import hashlib

    policy = config.policy.model_dump()
    policy["tenants"] = [*policy["tenants"], {"name": "other", "api_key_sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()}]
    policy["cache"] = {**(policy["cache"] or {}), **cache}
    return GatewayConfig.build(config.routes, PolicyConfig.model_validate(policy))


async def setup(start_emulator: StartEmulator, start_app: StartApp, redis_url: str, faults: FaultConfig | None = None,
                **cache: object) -> tuple[str, RunningEmulator]:
    emulator = await start_emulator(faults=faults)
    config = with_second_tenant(gateway_config([tier("t", [f"{emulator.url}/v1"])]), **cache)
    app = create_app(config, redis_url=redis_url)
    url = await start_app(app)
    return f"{url}/v1", emulator


def lines(logs: list[dict]) -> list[dict]:
    return [entry for entry in logs if entry["event"] == "request"]


async def settle() -> None:
    await asyncio.sleep(0.05)  # the store runs in the background after the answer


async def test_a_repeated_deterministic_request_is_served_from_the_cache(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    base, emulator = await setup(start_emulator, start_app, redis_url)
    client = AsyncOpenAI(base_url=base, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        first = await client.chat.completions.with_raw_response.create(
            model="t", messages=MESSAGES, max_tokens=8, temperature=0)
        await settle()
        second = await client.chat.completions.with_raw_response.create(
            model="t", messages=MESSAGES, max_tokens=8, temperature=0)
    assert "x-gateway-cache" not in first.headers and second.headers["x-gateway-cache"] == "hit"
    a, b = first.parse(), second.parse()
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.choices[0].finish_reason == a.choices[0].finish_reason
    assert a.usage and b.usage
    assert (b.usage.prompt_tokens, b.usage.completion_tokens, b.usage.total_tokens) == (
        a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens)
    assert emulator.engine.stats.received == 1
    miss, hit = lines(logs)
    assert (miss["cache"], hit["cache"]) == ("miss", "hit")
    assert hit["cost_usd"] == 0 and hit["avoided_cost_usd"] == pytest.approx(miss["cost_usd"]) and miss["cost_usd"] > 0
    assert hit["usage_source"] == "cache" and hit["completion_tokens"] == miss["completion_tokens"]


@pytest.mark.parametrize(("first_stream", "second_stream"), [(True, True), (True, False), (False, True)])
async def test_streams_are_stored_when_complete_and_replayed_either_way(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str, first_stream: bool,
        second_stream: bool) -> None:
    base, emulator = await setup(start_emulator, start_app, redis_url)
    client = AsyncOpenAI(base_url=base, api_key=TEST_API_KEY)

    async def ask(stream: bool) -> tuple[str, int | None]:
        if not stream:
            answer = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=8, seed=7)
            return answer.choices[0].message.content or "", answer.usage.completion_tokens if answer.usage else None
        chunks = [c async for c in await client.chat.completions.create(
            model="t", messages=MESSAGES, max_tokens=8, seed=7, stream=True, stream_options={"include_usage": True})]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, chunks[-1].usage.completion_tokens if chunks[-1].usage else None

    first = await ask(first_stream)
    await settle()
    second = await ask(second_stream)
    assert second == first and first[0]
    assert emulator.engine.stats.received == 1


async def test_non_deterministic_requests_bypass_the_cache(start_emulator: StartEmulator, start_app: StartApp,
                                                           redis_url: str) -> None:
    base, emulator = await setup(start_emulator, start_app, redis_url)
    client = AsyncOpenAI(base_url=base, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        for _ in range(2):
            await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=4, temperature=0.7)
            await settle()
    assert emulator.engine.stats.received == 2
    assert [line["cache"] for line in lines(logs)] == ["bypass", "bypass"]


@pytest.mark.parametrize(("shared", "hits"), [(False, 0), (True, 1)])
async def test_tenants_do_not_see_each_others_answers_unless_shared(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str, shared: bool, hits: int) -> None:
    base, emulator = await setup(start_emulator, start_app, redis_url, shared=shared)
    await AsyncOpenAI(base_url=base, api_key=TEST_API_KEY).chat.completions.create(
        model="t", messages=MESSAGES, max_tokens=4, temperature=0)
    await settle()
    raw = await AsyncOpenAI(base_url=base, api_key=OTHER_KEY).chat.completions.with_raw_response.create(
        model="t", messages=MESSAGES, max_tokens=4, temperature=0)
    assert (raw.headers.get("x-gateway-cache") == "hit") == bool(hits)
    assert emulator.engine.stats.received == 2 - hits


# (fault, what the client sees, the request line's outcome and error): each failure as it is, not any exception
FAULTS = [
    (FaultConfig(error_rate=1.0), "APIStatusError", "upstream_error"),
    (FaultConfig(disconnect_after_tokens=2), "APIError", "upstream_error"),
    (FaultConfig(malformed_sse=True), None, "ok"),
]


@pytest.mark.parametrize(("faults", "raised", "outcome"), FAULTS, ids=["error", "disconnect", "malformed"])
async def test_errors_and_broken_streams_are_never_stored(start_emulator: StartEmulator, start_app: StartApp,
                                                          redis_url: str, faults: FaultConfig, raised: str | None,
                                                          outcome: str) -> None:
    """Pins: a backend error, a stream cut mid-answer and a stream with malformed events are each never stored:
    the same request goes to the backend again, and each time it fails the way it failed the first time."""
    import openai

    base, emulator = await setup(start_emulator, start_app, redis_url, faults=faults)
    client = AsyncOpenAI(base_url=base, api_key=TEST_API_KEY, max_retries=0)
    with capture_logs() as logs:
        for _ in range(2):
            error: Exception | None = None
            text = ""
            try:
                stream = await client.chat.completions.create(model="t", messages=MESSAGES, max_tokens=6, seed=1,
                                                              stream=True)
                text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            except openai.APIError as err:
                error = err
            await settle()
            if raised is None:
                assert error is None and text, error  # malformed events are dropped; the answer is whole
            else:
                assert type(error).__name__ == raised or isinstance(error, getattr(openai, raised)), repr(error)
    assert emulator.engine.stats.received == 2  # the second request went to the backend again
    first, second = lines(logs)
    assert (first["cache"], second["cache"]) == ("miss", "miss")
    assert first["outcome"] == second["outcome"] == outcome
    assert first["error"] is not None and second["error"] == first["error"]  # said why it was not stored


async def test_a_cancelled_stream_is_not_stored(start_emulator: StartEmulator, start_app: StartApp,
                                                redis_url: str) -> None:
    import aiohttp

    base, emulator = await setup(start_emulator, start_app, redis_url)
    body = {"model": "t", "messages": MESSAGES, "max_tokens": 500, "seed": 3, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            await response.content.readany()
    await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base}/chat/completions", json={**body, "stream": False, "max_tokens": 500},
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            assert "x-gateway-cache" not in response.headers
