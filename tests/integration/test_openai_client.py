"""The official openai client, sync and async, streaming and not, through the gateway to emulators."""

import asyncio

import pytest
from openai import AsyncOpenAI, OpenAI
from structlog.testing import capture_logs

from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, tier
from tests.conftest import StartEmulator, StartGateway

MESSAGES = [{"role": "user", "content": "Tell me about tail latency"}]


@pytest.fixture
async def base_url(start_emulator: StartEmulator, start_gateway: StartGateway) -> str:
    small, large = await start_emulator(seed=1), await start_emulator(seed=2)
    config = gateway_config([
        tier("small", [f"{small.url}/v1"], input_per_mtok=1.0, output_per_mtok=2.0),
        tier("large", [f"{large.url}/v1"], precision="fp16", input_per_mtok=10.0, output_per_mtok=20.0),
    ])
    return f"{await start_gateway(config)}/v1"


async def test_async_chat_non_streaming_with_usage_headers_and_log(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        raw = await client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES, max_tokens=12)
    answer = raw.parse()
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert raw.headers["x-gateway-tier"] == "small"
    assert raw.headers["x-gateway-backend"] == "small-0"
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert line["request_id"] == raw.headers["x-request-id"]
    assert (line["tenant"], line["tier"], line["status"], line["outcome"]) == (TEST_TENANT, "small", 200, "ok")
    assert line["prompt_tokens"] == answer.usage.prompt_tokens
    assert line["completion_tokens"] == answer.usage.completion_tokens
    assert line["usage_source"] == "backend"
    expected = (answer.usage.prompt_tokens * 1.0 + answer.usage.completion_tokens * 2.0) / 1e6
    assert line["cost_usd"] == pytest.approx(expected)


async def test_async_chat_streaming_explicit_tier(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=TEST_API_KEY)
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model="large", messages=MESSAGES, max_tokens=10, stream=True)
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert (line["tier"], line["stream"], line["usage_source"]) == ("large", True, "backend")
    assert line["completion_tokens"] == sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert line["ttft_ms"] is not None and line["ttft_ms"] <= line["e2e_ms"]
    assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] * 10 + line["completion_tokens"] * 20) / 1e6)


async def test_streaming_usage_passes_through_when_asked(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=TEST_API_KEY)
    stream = await client.chat.completions.create(
        model="auto", messages=MESSAGES, max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == sum(1 for c in chunks if c.choices and c.choices[0].delta.content)


async def test_sync_client_completions_streaming_and_not(base_url: str) -> None:
    def call() -> tuple[str, str]:
        client = OpenAI(base_url=base_url, api_key=TEST_API_KEY)
        plain = client.completions.create(model="auto", prompt="Once upon a time", max_tokens=6)
        streamed = client.completions.create(model="auto", prompt="Once upon a time", max_tokens=6, stream=True)
        return plain.choices[0].text, "".join(c.choices[0].text for c in streamed if c.choices)

    plain, streamed = await asyncio.to_thread(call)
    assert plain and streamed
    assert plain == streamed  # the emulator is deterministic for the same request


async def test_sync_client_chat(base_url: str) -> None:
    def call() -> str | None:
        client = OpenAI(base_url=base_url, api_key=TEST_API_KEY)
        return client.chat.completions.create(model="small", messages=MESSAGES, max_tokens=4).choices[0].message.content

    assert await asyncio.to_thread(call)


async def test_models_list(base_url: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=TEST_API_KEY)
    assert [m.id async for m in client.models.list()] == ["auto", "small", "large"]
