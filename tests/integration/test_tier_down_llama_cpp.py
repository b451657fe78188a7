"""A tier whose only llama.cpp server dies (issue 30): `model: auto` goes around it to the nearest healthy tier,
saying so in a header and the log line; /readyz reports the tier unready; a request naming the tier, or a tenant
whose policy says `detour: false`, gets 503 with a Retry-After from the health-check interval."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import RoutesConfig
from gateway.local.children import Child, start_children, stop_children, wait_healthy
from gateway.local.redis_server import free_port
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config
from tests.conftest import StartApp

MODEL = "gemma3-270m-q4_k_m"
HEALTH_INTERVAL_S = 2.0
STRICT_KEY = "sk-no-detour"
HARD, EASY = "Prove that there are infinitely many primes.", "Say hi."
BANDS = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}


def routes() -> RoutesConfig:
    tiers = [{"name": name, "precision": "int4", "context_window": 1024, "tokenizer": f"gguf:{MODEL}",
              "prices": {"input_per_mtok": 0.05, "output_per_mtok": 0.5},
              "replicas": [{"name": f"{name}-a", "url": f"http://127.0.0.1:{free_port()}/v1", "model": MODEL,
                            "launch": {"kind": "llama_cpp", "model": MODEL, "n_threads": 1, "n_ctx": 512}}]}
             for name in ("small", "large")]
    return RoutesConfig.model_validate({"tiers": tiers})


@pytest.fixture
async def servers() -> AsyncIterator[tuple[RoutesConfig, list[Child]]]:
    config = routes()
    children = start_children(config)
    try:
        await wait_healthy(children, timeout_s=120)
        yield config, children
    finally:
        stop_children(children)


async def ask(session: aiohttp.ClientSession, url: str, model: str, prompt: str,
              key: str = TEST_API_KEY) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, dict(response.headers), await response.json()


async def test_auto_routes_around_a_dead_tier_and_readyz_says_so(servers: tuple[RoutesConfig, list[Child]],
                                                                   start_app: StartApp) -> None:
    routes_config, children = servers
    base = gateway_config(list(routes_config.tiers), balancing={"health_interval_s": HEALTH_INTERVAL_S})
    strict = {"name": "strict", "api_key_sha256": hashlib.sha256(STRICT_KEY.encode()).hexdigest(), "detour": False}
    tenants = [*base.policy.model_dump(mode="json")["tenants"], strict]
    config = gateway_config(list(routes_config.tiers), balancing={"health_interval_s": HEALTH_INTERVAL_S},
                            policy={"routing": BANDS, "tenants": tenants})
    url = await start_app(create_app(config, TableScorer({HARD: 0.9, EASY: 0.1})))
    async with aiohttp.ClientSession() as session:
        status, headers, _ = await ask(session, url, "auto", HARD)
        assert (status, headers["x-gateway-tier"], headers.get("x-gateway-rerouted-from")) == (200, "large", None)
        async with session.get(f"{url}/readyz") as response:
            ready = await response.json()
        assert ready["backends"] == "ready" and ready["backend_tiers"]["large"]["status"] == "ready"

        large = next(child for child in children if child.name == "large-a")
        os.killpg(large.process.pid, signal.SIGKILL)  # the tier's only server dies
        large.process.wait()
        deadline = time.monotonic() + 3 * HEALTH_INTERVAL_S
        while True:  # the next health check sees it
            async with session.get(f"{url}/readyz") as response:
                ready = await response.json()
                assert response.status == 200  # the gateway itself still serves
            if ready["backend_tiers"]["large"]["status"] == "unready" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert ready["backends"] == "degraded", ready
        assert ready["backend_tiers"]["small"] == {"status": "ready", "up": 1, "replicas": 1, "retry_in_s": 0.0}
        large_health = ready["backend_tiers"]["large"]
        assert (large_health["status"], large_health["up"]) == ("unready", 0)
        assert 0 < large_health["retry_in_s"] <= HEALTH_INTERVAL_S

        with capture_logs() as logs:
            status, headers, answer = await ask(session, url, "auto", HARD)
        assert status == 200 and answer["choices"][0]["message"]["content"] is not None
        assert (headers["x-gateway-tier"], headers["x-gateway-rerouted-from"]) == ("small", "large")
        [line] = [entry for entry in logs if entry["event"] == "request"]
        assert (line["tier"], line["rerouted_from"], line["backend"]) == ("small", "large", "small-a")
        assert any(entry["event"] == "tier_down_rerouted" for entry in logs)

        for model, key in (("large", TEST_API_KEY), ("auto", STRICT_KEY)):  # named, or the tenant forbids it
            status, headers, answer = await ask(session, url, model, HARD, key)
            assert (status, answer["error"]["code"]) == (503, "no_replica_available"), (model, answer)
            assert 1 <= int(headers["Retry-After"]) <= HEALTH_INTERVAL_S  # the next health check, not a constant
        status, headers, _ = await ask(session, url, "auto", EASY)  # the healthy tier's own traffic is untouched
        assert (status, headers["x-gateway-tier"], headers.get("x-gateway-rerouted-from")) == (200, "small", None)
