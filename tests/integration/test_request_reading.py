"""Issue 37's cases over real HTTP: the gateway decides from the request's reading (gateway.reading), so the
shapes a stage used to miss (token-id prompts, images, assistant-only turns, prompt lists, n, tools, tool-call
arguments) reach the caches, the prompt caps and the rate limit. A real gateway, the emulator and real Redis
on loopback; the semantic cache with the real ONNX encoder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import create_app
from gateway.classifier.difficulty import DifficultyClassifier, load_classifier
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

ROOT = Path(__file__).resolve().parents[2]
HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}
IMAGE = "data:image/png;base64,"


@pytest.fixture
async def classifier() -> AsyncIterator[DifficultyClassifier]:
    model = load_classifier(ROOT / "models" / "difficulty")
    yield model
    await model.aclose()


async def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/{path}", json=body, headers=HEADERS) as response:
            return response.status, await response.json(), response.headers.get("x-gateway-cache")


@pytest.fixture
async def semantic_gateway(start_emulator: StartEmulator, start_app: StartApp, classifier: DifficultyClassifier,
                           redis_url: str) -> str:
    emulator = await start_emulator()
    config = gateway_config([tier("t", [f"{emulator.url}/v1"])],
                            policy={"cache": {"mode": "always", "semantic": {"threshold": 0.9}}})
    return await start_app(create_app(config, classifier, redis_url))


async def ask_twice(url: str, path: str, first: dict[str, Any], second: dict[str, Any]) -> str | None:
    """Send `first`, let its answer be stored (in the background), then `second`: its cache header."""
    status, _, cache = await post(url, path, first)
    assert status == 200 and cache is None
    await asyncio.sleep(0.3)
    status, _, cache = await post(url, path, second)
    assert status == 200
    return cache


async def test_the_semantic_cache_tells_inputs_apart_that_are_not_text(semantic_gateway: str) -> None:
    url = semantic_gateway
    completion = {"model": "t", "max_tokens": 4}
    assert await ask_twice(url, "completions", {**completion, "prompt": [101, 2023, 2003]},
                           {**completion, "prompt": [7, 7, 7, 42]}) is None
    chat = {"model": "t", "max_tokens": 4}

    def with_image(data: str) -> dict[str, Any]:
        return {**chat, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": IMAGE + data}}]}]}

    assert await ask_twice(url, "chat/completions", with_image("AAAA"), with_image("BBBB")) is None
    question = {**chat, "messages": [{"role": "user", "content": "What is the capital city of France?"}]}
    assistant_only = {**chat, "messages": [{"role": "assistant", "content": "What is the capital city of France?"}]}
    assert await ask_twice(url, "chat/completions", question, assistant_only) is None
    # the cache does work where a paraphrase has a meaning: the same user question, reworded
    paraphrase = {**chat, "messages": [{"role": "user", "content": "What's the capital city of France?"}]}
    status, _, cache = await post(url, "chat/completions", paraphrase)
    assert status == 200 and cache == "semantic-hit"


async def test_a_prompt_list_is_never_answered_from_the_cache(semantic_gateway: str) -> None:
    body = {"model": "t", "max_tokens": 4, "prompt": ["first prompt", "second prompt"]}
    for _ in range(2):
        status, answer, cache = await post(semantic_gateway, "completions", body)
        assert status == 200 and cache is None
        await asyncio.sleep(0.3)


@pytest.mark.parametrize(("what", "path", "body"), [
    ("50,000 token ids", "completions", {"prompt": list(range(50_000))}),
    ("a 100 kB tool description", "chat/completions", {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "x" * 100_000}}]}),
    ("a 100 kB image part", "chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": IMAGE + "A" * 100_000}}]}]}),
    ("100 kB of tool-call arguments", "chat/completions", {"messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "y" * 100_000}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "and?"}]}),
])
async def test_the_prompt_caps_count_every_input(start_emulator: StartEmulator, start_app: StartApp, what: str,
                                                 path: str, body: dict[str, Any]) -> None:
    emulator = await start_emulator()
    for cap in ({"max_prompt_chars": 100}, {"max_prompt_tokens": 500}):
        config = gateway_config([tier("t", [f"{emulator.url}/v1"])], policy=cap)
        url = await start_app(create_app(config))
        status, error, _ = await post(url, path, {"model": "t", "max_tokens": 4, **body})
        assert status == 413, (what, cap, error)
        assert error["error"]["code"] == "prompt_too_large" and error["error"]["param"] in ("messages", "prompt")
    assert emulator.engine.stats.received == 0


async def test_a_burst_of_n_16_requests_is_charged_every_choice(start_emulator: StartEmulator, start_app: StartApp,
                                                                 redis_url: str) -> None:
    """3,000 tokens a minute and six requests at once of n 16 x 100 tokens: 1,600 tokens each at least, so one
    is admitted (it used to be charged 100 tokens, and all six got through: 9,600 tokens)."""
    emulator = await start_emulator()
    config = gateway_config([tier("t", [f"{emulator.url}/v1"])],
                            policy={"rate_limit": {"tokens_per_min": 3000}, "max_tokens": {"default": 100,
                                                                                         "maximum": 100}})
    url = await start_app(create_app(config, None, redis_url))
    body = {"model": "t", "max_tokens": 100, "n": 16, "messages": [{"role": "user", "content": "hi"}]}
    statuses = [status for status, _, _ in await asyncio.gather(*(post(url, "chat/completions", body)
                                                                  for _ in range(6)))]
    assert sorted(statuses) == [200] + [429] * 5
