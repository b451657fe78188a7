"""gateway.bench.client against a scripted SSE server on loopback: timings, tokens, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from gateway.bench.client import RequestResult, request_body, request_headers, send
from gateway.bench.runner import Target, open_session, run_closed_loop, run_open_loop
from gateway.bench.workload import RequestSpec

SPEC = RequestSpec(({"role": "user", "content": "hello there my friend"},), 3, 4, "conv", 1)


def _event(content: str) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"delta": {"content": content}}]}) + b"\n\n"


async def _scripted(request: web.Request) -> web.StreamResponse:
    mode = request.headers.get("x-mode", "ok")
    if mode == "busy":
        return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "2"})
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-gateway-tier": "small"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')  # no content: not the first token
    await asyncio.sleep(0.05)
    for i in range(3):
        await resp.write(_event(f" t{i}"))
        await asyncio.sleep(0.02)
    if mode == "error":
        await resp.write(b'data: {"error": {"message": "upstream died"}}\n\n')
    elif mode != "cut":
        usage = {"prompt_tokens": 11, "completion_tokens": 5} if body.get("stream_options") else None
        await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _scripted)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/chat/completions"
    await runner.cleanup()


async def _send(url: str, mode: str) -> RequestResult:
    async with open_session(5) as session:
        headers = request_headers("sk-x", {"x-mode": mode})
        return await send(session, url, request_body(SPEC, "m", True, None), headers, SPEC, 1.5)


async def test_timings_and_usage(url: str) -> None:
    r = await _send(url, "ok")
    assert r.ok and r.status == 200 and r.error is None and r.ttft_s is not None
    assert 0.045 <= r.ttft_s <= 0.5
    assert len(r.itl_s) == 2 and all(0.015 <= x <= 0.5 for x in r.itl_s)
    assert r.output_tokens == 5 and r.prompt_tokens == 11  # from usage
    assert r.tpot_s == pytest.approx((r.e2e_s - r.ttft_s) / 4)
    assert r.headers == {"x-gateway-tier": "small"} and r.start_s == 1.5
    assert (r.conversation_id, r.turn) == ("conv", 1)


@pytest.mark.parametrize(("mode", "error"), [("busy", "HTTP 429"), ("error", "upstream died"),
                                             ("cut", "without [DONE]")])
async def test_failures_are_reported(url: str, mode: str, error: str) -> None:
    r = await _send(url, mode)
    assert not r.ok and error in (r.error or "") and r.tpot_s is None
    if mode == "busy":
        assert r.headers["retry-after"] == "2"


async def test_connection_refused_does_not_raise() -> None:
    r = await _send("http://127.0.0.1:9/v1/chat/completions", "ok")
    assert not r.ok and "ClientConnectorError" in (r.error or "")


def test_body_and_headers() -> None:
    body = orjson.loads(request_body(SPEC, "auto", True, {"temperature": 0}))
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 3
    assert "ignore_eos" not in orjson.loads(request_body(SPEC, "auto", False, None))
    assert request_headers("k", {"x-a": "1"})["Authorization"] == "Bearer k"


async def test_runners_send_on_schedule_and_stop_at_duration(url: str) -> None:
    target = Target(url.removesuffix("/chat/completions"), "m")
    run = await run_open_loop(target, [SPEC] * 4, [0.0, 0.1, 0.2, 5.0], duration_s=1.0)
    assert len(run.results) == 3 and all(r.ok for r in run.results)  # the one at 5 s is never sent
    starts = sorted(r.start_s for r in run.results)
    assert starts[1] == pytest.approx(0.1, abs=0.05) and starts[2] == pytest.approx(0.2, abs=0.05)
    closed = await run_closed_loop(target, [SPEC], 2, duration_s=0.5)
    assert len(closed.results) >= 4 and all(r.ok for r in closed.results)  # ~0.12 s each, cycling
    short = await run_open_loop(target, [SPEC] * 2, [0.0, 0.0], drain_s=0.01)
    assert [r.error for r in short.results] == ["unfinished", "unfinished"]
