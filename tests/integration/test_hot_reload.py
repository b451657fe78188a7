"""Hot reload under continuous traffic: a valid change applies within a second, a broken file is
refused with file, line, field and reason while the last good version serves, and nothing fails."""

import asyncio
import hashlib
from pathlib import Path

import aiohttp
import pytest

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing import routes_yaml
from tests.conftest import StartApp, StartEmulator

KEY, ADMIN = "sk-reload", "sk-admin"


def policy(default_max_tokens: int) -> str:
    return f"""
default_tier: t
admin_api_key_sha256: {hashlib.sha256(ADMIN.encode()).hexdigest()}
max_tokens: {{default: {default_max_tokens}, maximum: 64}}
tenants:
  - name: team
    api_key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}
"""


async def traffic(session: aiohttp.ClientSession, url: str, stop: asyncio.Event, seen: list[tuple[int, int]]) -> None:
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    while not stop.is_set():
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {KEY}"}) as response:
            answer = await response.json()
            seen.append((response.status, answer.get("usage", {}).get("completion_tokens", -1)))
        await asyncio.sleep(0.01)


async def wait_for(seen: list[tuple[int, int]], tokens: int, timeout_s: float = 2.0) -> float:
    start = asyncio.get_running_loop().time()
    mark = len(seen)
    while asyncio.get_running_loop().time() - start < timeout_s:
        if any(t == tokens for _, t in seen[mark:]):
            return asyncio.get_running_loop().time() - start
        await asyncio.sleep(0.02)
    raise AssertionError(f"no answer with {tokens} tokens within {timeout_s} s")


async def test_reload_valid_then_broken_then_fixed_under_traffic(tmp_path: Path, start_emulator: StartEmulator,
                                                                 start_app: StartApp) -> None:
    emulator = await start_emulator()
    routes, policy_file = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(routes_yaml(f"{emulator.url}/v1"))
    policy_file.write_text(policy(4))
    url = await start_app(create_app(load_config(routes, policy_file), config_files=(routes, policy_file)))
    seen: list[tuple[int, int]] = []
    stop = asyncio.Event()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as session:
        load = asyncio.create_task(traffic(session, url, stop, seen))
        await wait_for(seen, 4)
        policy_file.write_text(policy(2))
        assert await wait_for(seen, 2) < 1.0
        policy_file.write_text(policy(3).replace("maximum: 64", "maximum: lots"))
        await asyncio.sleep(0.5)
        async with session.get(f"{url}/admin/config", headers=admin) as response:
            broken = await response.json()
        served_while_broken = seen[-5:]
        policy_file.write_text(policy(5))
        await wait_for(seen, 5)
        async with session.get(f"{url}/admin/config", headers=admin) as response:
            fixed = await response.json()
        async with session.get(f"{url}/admin/config", headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        stop.set()
        await load
    assert all(status == 200 for status, _ in seen), "a request failed during the reloads"
    assert {tokens for _, tokens in served_while_broken} == {2}  # the last good version kept serving
    [error] = broken["last_error"]
    assert str(policy_file) in error and ":4:" in error and "max_tokens.maximum" in error and "'lots'" in error
    assert fixed["last_error"] is None and fixed["reloads"] == 2


@pytest.mark.parametrize("path", ["/admin/config"])
async def test_admin_endpoints_are_off_without_an_admin_key(start_emulator: StartEmulator, start_app: StartApp,
                                                            path: str) -> None:
    from gateway.testing import gateway_config, tier

    emulator = await start_emulator()
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])])))
    async with aiohttp.ClientSession() as session:
        async with session.get(url + path, headers={"Authorization": "Bearer x"}) as response:
            assert response.status == 404 and "admin_api_key_sha256" in (await response.json())["error"]["message"]
