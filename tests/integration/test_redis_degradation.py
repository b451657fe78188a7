"""Redis is an accelerator, not a dependency: killed or restarted mid-traffic, no request fails."""

import asyncio

import aiohttp
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.local.redis_server import EmbeddedRedis
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

HEADERS = {"Authorization": f"Bearer {TEST_API_KEY}"}


async def traffic(session: aiohttp.ClientSession, url: str, n: int) -> list[tuple[int, str | None]]:
    """n deterministic requests over 4 distinct prompts: (status, x-gateway-cache) each."""
    results = []
    for i in range(n):
        body = {"model": "t", "messages": [{"role": "user", "content": f"prompt {i % 4}"}], "max_tokens": 3,
                "temperature": 0, "stream": i % 2 == 0}
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=HEADERS) as response:
            await response.read()
            results.append((response.status, response.headers.get("x-gateway-cache")))
        await asyncio.sleep(0.005)
    return results


async def test_requests_flow_while_redis_is_killed_and_restarted(start_emulator: StartEmulator,
                                                                 start_app: StartApp) -> None:
    emulator = await start_emulator()
    with EmbeddedRedis() as redis_server:
        config = gateway_config([tier("t", [f"{emulator.url}/v1"])])
        url = await start_app(create_app(config, redis_url=redis_server.url))
        async with aiohttp.ClientSession() as session:
            with capture_logs() as logs:
                warm = await traffic(session, url, 12)
                redis_server.kill()
                down = await traffic(session, url, 12)
                async with session.get(f"{url}/readyz") as response:
                    ready_while_down = await response.json()
                async with session.get(f"{url}/metrics") as response:
                    metrics_while_down = await response.text()
                redis_server.restart()
                await asyncio.sleep(1.2)  # the guard's backoff: then one probe reconnects
                back = await traffic(session, url, 16)
    assert all(status == 200 for status, _ in warm + down + back)
    assert any(cache == "hit" for _, cache in warm)
    assert not any(cache == "hit" for _, cache in down)
    assert any(cache == "hit" for _, cache in back[4:])  # the restarted (empty) Redis fills again and serves
    assert ready_while_down["redis"] == "down" and ready_while_down["status"] == "ready"
    assert "gateway_redis_up 0.0" in metrics_while_down
    assert any(entry["event"] == "redis_unavailable" for entry in logs)
    assert len([entry for entry in logs if entry["event"] == "request"]) == 40
