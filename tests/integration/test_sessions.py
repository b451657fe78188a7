"""Issues 32 and 38: a conversation keeps its tier across turns and gateway replicas (Redis), moving only up; the
response headers, the log line and `POST /admin/explain` say when the session held the choice.

A session is the conversation so far (issue 38): each later turn sends back the assistant's replies as the client
got them (the emulator's own text, as a real client would), and is found by the conversation through the last of
them; a first turn inherits nothing without an x-session-id, so a new chat that opens like an old one ("hi", the
same first message) routes on its own."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.reading import read
from gateway.routing.sessions import Held, SessionStore, conversation_keys, redis_key, session_id
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

BANDS = {"bands": [{"below": 0.35, "tier": "small"}, {"below": 0.7, "tier": "medium"}, {"tier": "large"}]}
ADMIN = "sk-admin"
TENANT = "test-tenant"  # gateway.testing's
ROOT = Path(__file__).resolve().parents[2]


class LastTurnScorer:
    """Difficulty from the conversation's last words: '... hard' 0.95, '... middling' 0.5, else 0.1."""

    async def score(self, text: str, *, scope: str = "") -> float:
        return 0.95 if text.rstrip().endswith("hard") else 0.5 if text.rstrip().endswith("middling") else 0.1


async def _gateways(start_emulator: StartEmulator, start_app: StartApp, redis_url: str, n: int = 2) -> list[str]:
    tiers = [tier(name, [f"{(await start_emulator()).url}/v1"]) for name in ("small", "medium", "large")]
    config = gateway_config(tiers, policy={"routing": BANDS, "sessions": {"ttl_s": 600},
                                           "admin_api_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest()})
    return [await start_app(create_app(config, LastTurnScorer(), redis_url=redis_url)) for _ in range(n)]


class Turn(tuple[str, str | None]):
    """A turn's (x-gateway-tier, x-gateway-session), with its route reason beside."""

    reason: str


class Chat:
    """One conversation as a client keeps it: each answer's text is sent back as the assistant's message."""

    def __init__(self, http: aiohttp.ClientSession, redis_url: str, system: str = "you help") -> None:
        self.http, self.redis_url = http, redis_url
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]

    async def ask(self, url: str, text: str, headers: dict[str, str] | None = None) -> Turn:
        self.messages.append({"role": "user", "content": text})
        body = {"model": "auto", "messages": self.messages, "max_tokens": 2, "user": "ann"}
        async with self.http.post(f"{url}/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {TEST_API_KEY}", **(headers or {})}) as response:
            answer = await response.json()
            assert response.status == 200, answer
            turn = Turn((response.headers["x-gateway-tier"], response.headers.get("x-gateway-session")))
            turn.reason = response.headers["x-gateway-route-reason"]
        reply = answer["choices"][0]["message"]["content"]
        assert reply  # the emulator's own words, sent back on the next turn
        if not headers:  # the conversation through this answer is recorded after it (in Redis in the background)
            answered = conversation_keys(TENANT, read("chat", body)).answered(reply)
            await _until_recorded(self.redis_url, redis_key(answered))
        self.messages.append({"role": "assistant", "content": reply})
        return turn


async def _until_recorded(redis_url: str, key: str, timeout_s: float = 5.0) -> None:
    """Wait until Redis holds `key` (another gateway replica reads the session from there)."""
    client = aioredis.from_url(redis_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while not await client.exists(key):
            assert loop.time() < deadline, f"the answered turn was not recorded in Redis ({key})"
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()


async def test_a_conversation_moves_only_up_across_two_gateway_replicas(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    one, two = await _gateways(start_emulator, start_app, redis_url)
    async with aiohttp.ClientSession() as http:
        chat = Chat(http, redis_url)
        with capture_logs() as logs:
            assert await chat.ask(one, "start middling") == ("medium", "new")
            held = await chat.ask(two, "an easy one")
            assert held == ("medium", "held from small")
            assert held.reason.startswith("held: the conversation's session holds medium; routed small")
            assert await chat.ask(one, "now hard") == ("large", "upgraded")
            held = await chat.ask(two, "middling")
            assert held == ("large", "held from medium") and held.reason.startswith("held")
            # a new conversation that opens like this one (same system prompt, user, first message) is its own
            fresh = await Chat(http, redis_url).ask(two, "start middling")
            assert fresh == ("medium", "new") and not fresh.reason.startswith("held")
    lines = [e for e in logs if e["event"] == "request"]
    assert [e["session_route"] for e in lines] == ["new", "held", "upgraded", "held", "new"]
    assert [e["tier"] for e in lines] == ["medium", "medium", "large", "large", "medium"]


async def test_a_new_conversations_hi_goes_small_after_another_reached_large(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    """Issue 38's report: conversation A "hi" -> small, A's hard second turn -> large; a new conversation that starts
    with "hi" was then held at large (its route reason naming the small tier)."""
    (url,) = await _gateways(start_emulator, start_app, redis_url, 1)
    async with aiohttp.ClientSession() as http:
        a = Chat(http, redis_url)
        assert await a.ask(url, "hi") == ("small", "new")
        assert await a.ask(url, "now hard") == ("large", "upgraded")
        hi = await Chat(http, redis_url).ask(url, "hi")
        assert hi == ("small", "new") and not hi.reason.startswith("held")
        assert await a.ask(url, "thanks") == ("large", "held from small")  # A itself still holds large


async def test_a_later_turn_is_found_by_the_replies_it_sends_back(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    """The lookup is the conversation through the last assistant reply: a reply the gateway did not give (edited,
    or another model's) continues no session."""
    (url,) = await _gateways(start_emulator, start_app, redis_url, 1)
    async with aiohttp.ClientSession() as http:
        chat = Chat(http, redis_url)
        assert await chat.ask(url, "very hard") == ("large", "new")
        real = list(chat.messages)
        chat.messages[-1] = {"role": "assistant", "content": real[-1]["content"] + " (edited)"}
        assert await chat.ask(url, "easy now") == ("small", "new")
        chat.messages = real  # the conversation as the gateway answered it
        held = await chat.ask(url, "easy now")
        assert held == ("large", "held from small") and held.reason.startswith("held")


async def test_an_explicit_session_id_carries_a_first_turn_and_explain_says_it_holds(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    (url,) = await _gateways(start_emulator, start_app, redis_url, 1)
    sid = {"x-session-id": "chat-42"}
    async with aiohttp.ClientSession() as http:
        assert await Chat(http, redis_url).ask(url, "very hard", sid) == ("large", "new")
        held = await Chat(http, redis_url).ask(url, "unrelated easy", sid)  # a first turn, carried by the header
        assert held == ("large", "held from small") and held.reason.startswith("held")
        assert await Chat(http, redis_url).ask(url, "unrelated easy") == ("small", "new")  # no header: its own
        request = {"model": "auto", "messages": [{"role": "user", "content": "easy again"}], "user": "ann"}
        async with http.post(f"{url}/admin/explain", headers={"Authorization": f"Bearer {ADMIN}"},
                             json={"tenant": TENANT, "request": request, "session_id": "chat-42"}) as r:
            report = await r.json()
    assert report["session"]["holds"] == "large" and report["session"]["effect"].startswith("held")
    assert report["tier"] == "large" and report["route_reason"].startswith("held: ")  # routed small, held large
    assert report["route_reason"].endswith("routed small (band: difficulty 0.1000 -> small)")


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
