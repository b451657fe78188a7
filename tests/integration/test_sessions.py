"""Issue 32: a conversation keeps its tier across turns and gateway replicas (Redis), moving only up; the
response header, the log line and `POST /admin/explain` say when the session held the choice."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.routing.sessions import Held, SessionStore, session_id
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

BANDS = {"bands": [{"below": 0.35, "tier": "small"}, {"below": 0.7, "tier": "medium"}, {"tier": "large"}]}
ADMIN = "sk-admin"
ROOT = Path(__file__).resolve().parents[2]


class LastTurnScorer:
    """Difficulty from the conversation's last words: '... hard' 0.95, '... middling' 0.5, else 0.1."""

    async def score(self, text: str) -> float:
        return 0.95 if text.rstrip().endswith("hard") else 0.5 if text.rstrip().endswith("middling") else 0.1


async def _gateways(start_emulator: StartEmulator, start_app: StartApp, redis_url: str, n: int = 2) -> list[str]:
    tiers = [tier(name, [f"{(await start_emulator()).url}/v1"]) for name in ("small", "medium", "large")]
    config = gateway_config(tiers, policy={"routing": BANDS, "sessions": {"ttl_s": 600},
                                           "admin_api_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()})
    return [await start_app(create_app(config, LastTurnScorer(), redis_url=redis_url)) for _ in range(n)]


def _turns(*users: str) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "you help"}]
    for i, text in enumerate(users):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i}"})
        messages.append({"role": "user", "content": text})
    return messages


async def _ask(session: aiohttp.ClientSession, url: str, messages: list[dict],
               headers: dict | None = None) -> tuple[str, str | None]:
    body = {"model": "auto", "messages": messages, "max_tokens": 2, "user": "ann"}
    async with session.post(f"{url}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {TEST_API_KEY}", **(headers or {})}) as response:
        await response.read()
        assert response.status == 200
        return response.headers["x-gateway-tier"], response.headers.get("x-gateway-session")


async def test_a_conversation_moves_only_up_across_two_gateway_replicas(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    one, two = await _gateways(start_emulator, start_app, redis_url)
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            assert await _ask(session, one, _turns("start middling")) == ("medium", "new")
            assert await _ask(session, two, _turns("start middling", "an easy one")) == ("medium", "held from small")
            assert await _ask(session, one, _turns("start middling", "an easy one", "now hard")) == ("large",
                                                                                                    "upgraded")
            assert await _ask(session, two, _turns("start middling", "an easy one", "now hard", "middling")) == (
                "large", "held from medium")
            # another conversation is another session
            assert await _ask(session, two, _turns("other chat")) == ("small", "new")
    lines = [e for e in logs if e["event"] == "request"]
    assert [e["session_route"] for e in lines] == ["new", "held", "upgraded", "held", "new"]
    assert len({e["session"] for e in lines[:4]}) == 1 and lines[4]["session"] != lines[0]["session"]


async def test_an_explicit_session_id_ties_unrelated_prompts_and_explain_says_it_holds(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    (url,) = await _gateways(start_emulator, start_app, redis_url, 1)
    sid = {"x-session-id": "chat-42"}
    async with aiohttp.ClientSession() as session:
        assert await _ask(session, url, _turns("very hard"), sid) == ("large", "new")
        assert await _ask(session, url, _turns("unrelated easy"), sid) == ("large", "held from small")
        assert await _ask(session, url, _turns("unrelated easy")) == ("small", "new")  # no header: its own session
        request = {"model": "auto", "messages": _turns("easy again"), "user": "ann"}
        async with session.post(f"{url}/admin/explain", headers={"Authorization": f"Bearer {ADMIN}"},
                                json={"tenant": "test-tenant", "request": request, "session_id": "chat-42"}) as r:
            report = await r.json()
    assert report["tier"] == "small"  # what the route stage chose...
    assert report["session"]["holds"] == "large" and report["session"]["effect"].startswith("held")  # ...and the session


def test_cli_route_explain_looks_the_session_up_in_redis(tmp_path: Path, redis_url: str) -> None:
    policy = yaml.safe_load((ROOT / "policies/emulator.yaml").read_text())
    policy["sessions"] = {"ttl_s": 600}
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    key = session_id("demo", "chat-7", {})
    assert key is not None
    held = Held(2, "large-fp16")  # routes/emulator.yaml's third tier
    asyncio.run(_hold(redis_url, key, held))
    run = [sys.executable, "-m", "gateway", "route", "explain", "--routes", str(ROOT / "routes/emulator.yaml"),
           "--policies", str(tmp_path / "policy.yaml"), "--tenant", "demo", "--prompt", "hi", "--json"]
    looked_up = subprocess.run([*run, "--session-id", "chat-7", "--redis", redis_url], capture_output=True, text=True,
                               timeout=60)
    assert looked_up.returncode == 0, looked_up.stderr
    session = json.loads(looked_up.stdout)["session"]
    assert session["holds"] == "large-fp16" and session["effect"].startswith("held")
    unchecked = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert "not checked" in json.loads(unchecked.stdout)["session"]["effect"]


async def _hold(redis_url: str, key: str, held: Held) -> None:
    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    await SessionStore(guard).hold(key, held, 600)
    await guard.client.aclose()
