"""Redis dying in the middle of a request (test_redis_degradation kills it between requests): a request admitted
by the global limiter and looked up in the cache while Redis was up, whose Redis writes (the cache store, the
token and spend booking) come after Redis is gone, is answered whole (200, every token, no error event), logs
its line as served, and the gateway says Redis is unavailable; the next requests are limited locally (said in
`limits_local`) and served; a Redis frozen (SIGSTOP) under a request costs at most the guard's timeouts."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.local.redis_server import EmbeddedRedis
from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, tier
from gateway.testing.upstream import DONE, chunk, content
from tests.conftest import StartApp

HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}
WORDS = [f"w{i} " for i in range(20)]
LIMITED = {"name": TEST_TENANT, "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest(),
           "rate_limit": {"requests_per_min": 1000, "tokens_per_min": 1_000_000}, "daily_budget_usd": 100.0}


@pytest.fixture
def redis_server() -> Iterator[EmbeddedRedis]:  # this module's own: it gets killed
    with EmbeddedRedis() as server:
        yield server


def slow_backend(gate: asyncio.Event, reached: asyncio.Event | None = None) -> Any:
    """Streams WORDS; after the first word it waits for `gate` (the test kills Redis meanwhile). Non-streamed
    requests get the whole text as JSON, after the gate too. Sets `reached` when a request arrives."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if reached is not None:
            reached.set()
        usage = {"prompt_tokens": 5, "completion_tokens": len(WORDS), "total_tokens": 5 + len(WORDS)}
        if not body.get("stream"):
            await gate.wait()
            return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "".join(WORDS)}}],
                                      "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, word in enumerate(WORDS):
            await response.write(content(word, "stop" if i == len(WORDS) - 1 else None))
            if i == 0:
                await gate.wait()
        await response.write(chunk([], usage=usage) + DONE)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


def config(url: str) -> GatewayConfig:
    return gateway_config([tier("t", [url])], policy={"tenants": [LIMITED]})


def body(stream: bool, question: str = "What is Redis?") -> dict[str, Any]:
    return {"model": "t", "messages": [{"role": "user", "content": question}], "max_tokens": 32, "temperature": 0,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}


def text_of(raw: bytes, stream: bool) -> str:
    if not stream:
        return str(orjson.loads(raw)["choices"][0]["message"]["content"])
    events = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    assert not [e for e in events if "error" in e], events
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


async def lines(logs: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    for _ in range(100):
        found = [e for e in logs if e["event"] == "request"]
        if len(found) >= count:
            return found
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} request lines expected: {logs}")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
async def test_redis_killed_while_a_request_is_in_flight(start_app: StartApp, redis_server: EmbeddedRedis,
                                                         stream: bool) -> None:
    """Pins: a request admitted through Redis (global limiter, cache lookup) is answered whole when Redis dies
    before its answer is done: 200, every word, no error event, its log line says served ('miss', cost > 0);
    `redis_unavailable` is logged; the requests after it are admitted locally (`limits_local`, reason
    redis_down) and served, none gets a 5xx."""
    gate, reached = asyncio.Event(), asyncio.Event()
    upstream = await start_app(slow_backend(gate, reached))
    url = await start_app(create_app(config(f"{upstream}/v1"), redis_url=redis_server.url))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            async def first() -> tuple[int, bytes]:
                async with session.post(f"{url}/v1/chat/completions", json=body(stream), headers=HEADERS) as response:
                    return response.status, await response.read()

            task = asyncio.create_task(first())
            await asyncio.wait_for(reached.wait(), 10)  # at the backend: limiter and cache lookup are behind it
            await asyncio.sleep(0.05)  # streamed: the first word is on its way to the client
            redis_server.kill()
            gate.set()
            status, raw = await asyncio.wait_for(task, 10)
            later = []
            for i in range(6):
                async with session.post(f"{url}/v1/chat/completions", json=body(i % 2 == 0, f"q{i}"),
                                        headers=HEADERS) as response:
                    later.append((response.status, text_of(await response.read(), i % 2 == 0)))
            found = await lines(logs, 7)
    assert status == 200 and text_of(raw, stream) == "".join(WORDS)
    line = found[0]
    assert (line["status"], line["outcome"], line["cache"], line["completion_tokens"]) == (200, "ok", "miss", 20)
    assert line["cost_usd"] > 0
    assert later == [(200, "".join(WORDS))] * 6
    assert all(e["status"] == 200 for e in found)
    assert any(e["event"] == "redis_unavailable" for e in logs)
    local = [e for e in logs if e["event"] == "limits_local"]
    assert local and local[0]["reason"] == "redis_down"


async def test_a_redis_frozen_under_a_request_costs_only_the_guards_timeouts(start_app: StartApp,
                                                                              redis_server: EmbeddedRedis) -> None:
    """Pins: a Redis that stops answering (SIGSTOP: connections open, no replies) while requests arrive is not an
    outage: each is served, 200, within a few of the guard's timeouts, and limited locally."""
    gate = asyncio.Event()
    gate.set()
    upstream = await start_app(slow_backend(gate))
    url = await start_app(create_app(config(f"{upstream}/v1"), redis_url=redis_server.url))
    assert redis_server.process is not None
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body(True), headers=HEADERS) as response:
            assert response.status == 200  # Redis up: connected, warm
            await response.read()
        os.kill(redis_server.process.pid, signal.SIGSTOP)
        try:
            with capture_logs() as logs:
                results = []
                for i in range(4):
                    async with session.post(f"{url}/v1/chat/completions", json=body(i % 2 == 0, f"f{i}"),
                                            headers=HEADERS) as response:
                        results.append((response.status, text_of(await response.read(), i % 2 == 0)))
        finally:
            os.kill(redis_server.process.pid, signal.SIGCONT)
    assert results == [(200, "".join(WORDS))] * 4
    assert [e["status"] for e in logs if e["event"] == "request"] == [200] * 4
    assert any(e["event"] == "limits_local" for e in logs)
