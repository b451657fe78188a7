"""What a request is priced on, through the gateway to a scripted backend: a non-streamed answer that reports no
usage is counted by the tier's tokenizer (not priced as 0 output tokens), and the prompt tokens the backend
says it served from its prefix cache (`prompt_tokens_details.cached_tokens`) are priced at the cached rate."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.config import Tier
from gateway.testing import TEST_API_KEY, gateway_config
from gateway.testing.upstream import DONE, chunk, content
from gateway.tokens import TokenCounters
from tests.conftest import StartApp, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 64}
ANSWER = "The quick brown fox jumps over the lazy dog near the river bank"
USAGE = {"prompt_tokens": 1000, "completion_tokens": 10, "total_tokens": 1010,
         "prompt_tokens_details": {"cached_tokens": 800}}


def priced_tier(url: str) -> Tier:
    """1 USD per 1M prompt tokens, 0.1 per 1M cached prompt tokens, 2 per 1M output tokens."""
    return Tier.model_validate({
        "name": "t", "precision": "int4", "context_window": 8192,
        "prices": {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.1, "output_per_mtok": 2.0},
        "replicas": [{"name": "t-0", "url": url, "model": "m"}]})


def backend(usage: dict[str, Any] | None) -> web.Application:
    """Answers chat completions with ANSWER, streamed or not as asked, reporting `usage` (None: none at all)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            answer: dict[str, Any] = {
                "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}]}
            if usage is not None:
                answer["usage"] = usage
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(content(ANSWER, "stop"))
        if usage is not None:
            await response.write(chunk([], usage=usage))
        await response.write(DONE)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def ask(gateway: str, **extra: Any) -> tuple[int, bytes, dict[str, Any]]:
    """Status, body and the request's log line."""
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{gateway}/v1/chat/completions", json={**CHAT, **extra}, headers=AUTH) as response:
                status, body = response.status, await response.read()
    (line,) = [e for e in logs if e["event"] == "request"]
    return status, body, line


async def test_a_non_streamed_answer_without_usage_is_priced_on_its_counted_tokens(
        start_app: StartApp, start_gateway: StartGateway) -> None:
    """Pins: a backend that reports no usage on a non-streamed answer gets the answer's text counted by the tier's
    tokenizer for completion_tokens (the price and the budget use it), never 0."""
    upstream = await start_app(backend(None))
    gateway = await start_gateway(gateway_config([priced_tier(f"{upstream}/v1")]))
    status, body, line = await ask(gateway)
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == ANSWER
    counter = TokenCounters().for_spec(None)
    expected = counter.count(ANSWER)
    assert expected >= 10  # the tokenizer the tier names (the default WordPiece) counts the words
    assert line["usage_source"] == "counted" and line["completion_tokens"] == expected
    assert line["prompt_tokens"] > 0
    assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] * 1.0 + expected * 2.0) / 1e6)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_cached_prompt_tokens_are_priced_at_the_cached_rate(start_app: StartApp, start_gateway: StartGateway,
                                                                  stream: bool) -> None:
    """Pins: the backend's `prompt_tokens_details.cached_tokens` is taken and discounted: 200 prompt tokens at 1 USD
    per 1M, 800 cached at 0.1, 10 output at 2: 300 micro-dollars (1,020 if the discount were ignored)."""
    upstream = await start_app(backend(USAGE))
    gateway = await start_gateway(gateway_config([priced_tier(f"{upstream}/v1")]))
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    status, _, line = await ask(gateway, **extra)
    assert status == 200
    assert (line["usage_source"], line["prompt_tokens"], line["completion_tokens"], line["cached_tokens"]) == (
        "backend", 1000, 10, 800)
    assert line["cost_usd"] == pytest.approx(300e-6)
