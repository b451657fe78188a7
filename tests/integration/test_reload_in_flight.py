"""A hot reload while requests are in flight: each request finishes under the config version it started with
(`RequestContext.config`, taken once at the edge), and the requests after the reload get the new one. The
backend holds the first answers until the reload has applied; the new version changes the tier's prices and
the tenant's TTFT objective, both of which the request line reports."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing import routes_yaml
from gateway.testing.upstream import DONE, chunk, content
from tests.conftest import StartApp

KEY = "sk-reload"
USAGE = {"prompt_tokens": 5, "completion_tokens": 20, "total_tokens": 25}


def policy(slo_ms: int) -> str:
    return f"""
default_tier: t
ttft_slo_ms: {slo_ms}
tenants:
  - name: team
    api_key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}
"""


def held_backend(gate: asyncio.Event, arrived: list[str]) -> web.Application:
    """Answers every request (streamed or not) with 20 tokens' usage, once `gate` is set."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        arrived.append(body["messages"][0]["content"])
        await gate.wait()
        if not body.get("stream"):
            return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant", "content": "done"}}],
                                      "usage": USAGE})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(content("done", "stop") + chunk([], usage=USAGE) + DONE)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def post(session: aiohttp.ClientSession, url: str, question: str, stream: bool) -> int:
    body: dict[str, Any] = {"model": "t", "messages": [{"role": "user", "content": question}], "max_tokens": 32,
                            "stream": stream}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as response:
        await response.read()
        return response.status


async def config_version(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(f"{url}/readyz") as response:
        return orjson.loads(await response.read())["config_version"]


async def test_requests_in_flight_keep_the_config_they_started_with(tmp_path: Path, start_app: StartApp) -> None:
    """Pins: a reload applies to new requests only: two requests (one streamed) held at the backend across a
    reload that raises the output price fourfold and the TTFT objective are priced and logged under the old
    version; the request after it under the new one."""
    gate, arrived = asyncio.Event(), []
    upstream = await start_app(held_backend(gate, arrived))
    routes, policy_file = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(routes_yaml(f"{upstream}/v1"))
    policy_file.write_text(policy(1000))
    url = await start_app(create_app(load_config(routes, policy_file), config_files=(routes, policy_file)))
    async with aiohttp.ClientSession() as session:
        before = await config_version(session, url)
        with capture_logs() as logs:
            held = [asyncio.create_task(post(session, url, f"old {i}", stream=i == 1)) for i in range(2)]
            for _ in range(200):
                if len(arrived) == 2:
                    break
                await asyncio.sleep(0.01)
            assert len(arrived) == 2  # both in flight, at the backend
            routes.write_text(routes_yaml(f"{upstream}/v1").replace("output_per_mtok: 2.0", "output_per_mtok: 8.0"))
            policy_file.write_text(policy(2000))
            for _ in range(300):  # the watcher applies the new version (within a second)
                if await config_version(session, url) != before:
                    break
                await asyncio.sleep(0.02)
            assert await config_version(session, url) != before, "the reload did not apply"
            gate.set()
            assert await asyncio.gather(*held) == [200, 200]
            assert await post(session, url, "new", stream=False) == 200
        found = [e for e in logs if e["event"] == "request"]
    old = [e for e in found if e["ttft_slo_ms"] == 1000]  # the old objective: the tenant of the old version
    new = [e for e in found if e["ttft_slo_ms"] == 2000]
    assert len(found) == 3 and len(old) == 2 and len(new) == 1, [(e["ttft_slo_ms"], e["cost_usd"]) for e in found]
    assert {e["stream"] for e in old} == {True, False}
    for line in old:  # 5 prompt tokens at 1 USD per 1M, 20 output tokens at the old 2 USD
        assert line["status"] == 200 and line["cost_usd"] == pytest.approx((5 * 1.0 + 20 * 2.0) / 1e6)
    assert new[0]["cost_usd"] == pytest.approx((5 * 1.0 + 20 * 8.0) / 1e6)  # the new price
