"""A replica URL with credentials never reaches a tenant, a log line or an admin answer whole (issue 37), and a
client's 3 MB `model` string makes a small log line: a real gateway on loopback, logs captured."""

from __future__ import annotations

import hashlib

import aiohttp
import orjson
from structlog.testing import capture_logs

from gateway.accounting.log import MAX_FIELD_CHARS
from gateway.app import create_app
from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

ADMIN = "sk-admin"
SECRETS = ("hunter2", "SECRET", "sigvalue")


def leaky(emulator_url: str) -> str:
    """The emulator's URL with userinfo and secret query values, and a byte the upstream client refuses to send:
    the routes schema takes it, the request fails before it leaves, with the URL in the error."""
    host = emulator_url.removeprefix("http://")
    return f"http://admin:hunter2@{host}/v1?api-version=1&token=SECRET\u00e9&sig=sigvalue"


async def test_a_failing_replica_url_is_shown_without_its_secrets(start_emulator: StartEmulator,
                                                                  start_app: StartApp) -> None:
    emulator = await start_emulator()
    config = gateway_config([tier("t", [leaky(emulator.url)])],
                            policy={"admin_api_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()})
    url = await start_app(create_app(config))
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
                status, answer = response.status, await response.text()
        async with session.post(f"{url}/admin/explain", json={"tenant": TEST_TENANT, "request": body},
                                headers={"Authorization": f"Bearer {ADMIN}"}) as response:
            assert response.status == 200
            explained = await response.text()
    assert status == 502 and "backend t-0" in answer and "***@" in answer
    logged = orjson.dumps(logs).decode()
    assert "***@" in logged  # the failure is logged, redacted
    assert "***@" in explained and "api-version=1" in explained  # a known-public query value stays
    for text in (answer, logged, explained):
        assert not any(secret in text for secret in SECRETS), text


async def test_a_huge_model_string_makes_a_small_log_line(start_emulator: StartEmulator,
                                                          start_app: StartApp) -> None:
    emulator = await start_emulator()
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])])))
    body = {"model": "m" * 3_000_000, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
                await response.read()
    (request,) = [entry for entry in logs if entry.get("event") == "request"]
    assert request["model_requested"].endswith("[cut: 3000000 chars]")
    assert len(orjson.dumps(request)) < 4 * MAX_FIELD_CHARS + 4000
    assert max(len(orjson.dumps(entry)) for entry in logs) < 4 * MAX_FIELD_CHARS + 4000
