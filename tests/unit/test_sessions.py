"""Issues 32 and 38, sticky-tier sessions: the session id, the store (Redis, in process, and across an outage), the
step: keyed by the conversation so far (a first turn inherits nothing; later turns found by the prefix through the
assistant's last reply), the route reason saying "held"."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.context import RequestContext
from gateway.routing.sessions import Held, LocalSessions, SessionStore, session_id
from gateway.routing.session import SessionStage
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import parsed_context, run_finishers

SMALL, MEDIUM, LARGE = Held(0, "small"), Held(1, "medium"), Held(2, "large")


def _chat(first: str, *later: str, system: str = "sys", user: str | None = None) -> dict:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for i, text in enumerate(later):
        messages += [{"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": text}]
    body: dict = {"model": "auto", "messages": messages}
    if user is not None:
        body["user"] = user
    return body


def test_every_turn_of_a_conversation_has_one_id_and_other_conversations_others() -> None:
    first, third = _chat("plan a trip"), _chat("plan a trip", "to Rome", "by train")
    assert session_id("t", None, first) == session_id("t", None, third) is not None
    assert session_id("t", None, _chat("plan a party")) != session_id("t", None, first)
    assert session_id("t", None, _chat("plan a trip", user="ann")) != session_id("t", None, _chat("plan a trip",
                                                                                                  user="bob"))
    assert session_id("other", None, first) != session_id("t", None, first)  # per tenant
    assert session_id("t", "s-1", first) == session_id("t", "s-1", _chat("anything")) != session_id("t", "s-2", first)
    assert session_id("t", None, {"model": "auto", "messages": []}) is None


async def test_the_in_process_store_only_moves_up_and_forgets_after_the_ttl() -> None:
    store = SessionStore(None)
    assert await store.hold("k", MEDIUM, 60) == (MEDIUM, None)
    assert await store.hold("k", SMALL, 60) == (MEDIUM, MEDIUM)  # a smaller turn keeps the session's tier
    assert await store.hold("k", LARGE, 60) == (LARGE, MEDIUM)  # a larger one upgrades it
    assert await store.hold("k", MEDIUM, 60) == (LARGE, LARGE)
    local = LocalSessions(size=2)
    local.put("a", SMALL, 10.0)
    assert local.get("a", 9.0) == SMALL and local.get("a", 10.0) is None  # expired
    for key in "bcd":
        local.put(key, SMALL, 100.0)
    assert local.get("b", 0.0) is None and local.get("d", 0.0) == SMALL  # least recently used dropped


async def test_redis_shares_a_session_between_gateway_replicas(redis_url: str) -> None:
    one, two = (SessionStore(RedisGuard(connect(redis_url), op_timeout_s=0.5)) for _ in range(2))
    assert await one.hold("k", MEDIUM, 60) == (MEDIUM, None)
    assert await two.hold("k", SMALL, 60) == (MEDIUM, MEDIUM)  # the other replica sees the session
    assert await two.hold("k", LARGE, 60) == (LARGE, MEDIUM)
    assert await one.hold("k", SMALL, 60) == (LARGE, LARGE)
    assert await one.peek("k") == LARGE
    ttl = await one._guard.client.ttl("sess:k")  # type: ignore[union-attr]
    assert 0 < ttl <= 60


async def test_concurrent_turns_never_move_a_session_down(redis_url: str) -> None:
    stores = [SessionStore(RedisGuard(connect(redis_url), op_timeout_s=1.0)) for _ in range(4)]
    tiers = [SMALL, MEDIUM, LARGE] * 20
    await asyncio.gather(*(stores[i % 4].hold("race", held, 60) for i, held in enumerate(tiers)))
    assert await stores[0].peek("race") == LARGE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_without_redis_the_replica_keeps_its_sessions_in_process_and_never_downgrades_after(
        redis_url: str) -> None:
    down = SessionStore(RedisGuard(connect(f"redis://127.0.0.1:{_free_port()}"), op_timeout_s=0.05))
    assert await down.hold("k", LARGE, 60) == (LARGE, None)
    assert await down.hold("k", SMALL, 60) == (LARGE, LARGE)
    # Redis back, but it knows the session lower than this replica does: the replica's floor wins, and Redis learns
    up = SessionStore(RedisGuard(connect(redis_url), op_timeout_s=0.5), local=down.local)
    await SessionStore(RedisGuard(connect(redis_url), op_timeout_s=0.5)).hold("k", SMALL, 60)
    assert (await up.hold("k", SMALL, 60))[0] == LARGE
    assert await up.peek("k") == LARGE


CONFIG = gateway_config([tier("small", ["http://127.0.0.1:9/v1"]), tier("medium", ["http://127.0.0.1:9/v1"]),
                         tier("large", ["http://127.0.0.1:9/v1"], context_window=100)],
                        policy={"sessions": {"ttl_s": 600}})


async def _turn(stage: SessionStage, body: dict, routed: str, config: object = CONFIG, *,
                answer: str | None = None, header: str | None = None) -> RequestContext:
    """One turn through the session step, answered with `answer` (the finishers run: the next turn finds it)."""
    ctx = await parsed_context(config, body)  # type: ignore[arg-type]
    ctx.tenant = next(iter(ctx.config.tenants_by_key_hash.values()))  # what the policy stage sets
    ctx.route.tier = ctx.config.tiers[routed]
    ctx.route.route_reason = f"band: -> {routed}"
    ctx.session_header = header
    await stage(ctx)
    ctx.result.status, ctx.upstream.response_text = 200, answer
    run_finishers(ctx)
    await asyncio.sleep(0)
    return ctx


def _conversation(*turns: tuple[str, str]) -> dict:
    """A chat body: each (user, assistant) exchange, then the last user message (its assistant text unused)."""
    messages = [{"role": "system", "content": "sys"}]
    for i, (user, reply) in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": reply})
    return {"model": "auto", "messages": messages}


async def test_the_stage_holds_the_sessions_tier_and_says_so() -> None:
    stage = SessionStage(SessionStore(None))
    ctx = await _turn(stage, _chat("hi"), "medium", answer="answer 0")
    assert (ctx.route.tier.name, ctx.route.session_route) == ("medium", "new") and ctx.route.session is not None
    ctx = await _turn(stage, _chat("hi", "easy one"), "small", answer="answer 1")
    assert (ctx.route.tier.name, ctx.route.session_route, ctx.route.session_from) == ("medium", "held", "small")
    assert ctx.route.route_reason is not None and ctx.route.route_reason.startswith("held: the conversation's session holds medium")
    ctx = await _turn(stage, _chat("hi", "easy one", "now hard"), "large", answer="answer 2")
    assert (ctx.route.tier.name, ctx.route.session_route) == ("large", "upgraded")
    ctx = await _turn(stage, {**_chat("hi", "easy one", "now hard", "c"), "max_tokens": 500}, "small")
    assert (ctx.route.tier.name, ctx.route.session_route) == ("small", "kept")  # large cannot take 500 tokens: not held


async def test_a_new_conversation_opening_alike_inherits_nothing() -> None:
    """Issue 38: conversation A "hi" -> small, A's hard turn -> large; a new conversation "hi" goes small."""
    stage = SessionStage(SessionStore(None))
    a1 = await _turn(stage, _conversation(("hi", "")), "small", answer="Hello! How can I help?")
    assert (a1.route.tier.name, a1.route.session_route) == ("small", "new")
    a2 = await _turn(stage, _conversation(("hi", "Hello! How can I help?"), ("prove it", "")), "large",
                     answer="A proof.")
    assert (a2.route.tier.name, a2.route.session_route) == ("large", "upgraded")
    b1 = await _turn(stage, _conversation(("hi", "")), "small", answer="Hi there.")
    assert (b1.route.tier.name, b1.route.session_route, b1.route.session_from) == ("small", "new", None)
    assert b1.route.route_reason == "band: -> small"  # not held: the reason names the tier that serves
    # A's next easy turn is found by its conversation so far (the assistant's replies included): held at large
    a3 = await _turn(stage, _conversation(("hi", "Hello! How can I help?"), ("prove it", "A proof."), ("thanks", "")),
                     "small")
    assert (a3.route.tier.name, a3.route.session_route, a3.route.session_from) == ("large", "held", "small")
    assert a3.route.route_reason is not None and a3.route.route_reason.startswith("held")
    # the same user turns after another reply are another conversation: not held
    other = await _turn(stage, _conversation(("hi", "Hello! How can I help?"), ("prove it", "No."), ("thanks", "")),
                        "small")
    assert (other.route.tier.name, other.route.session_route) == ("small", "new")


async def test_an_explicit_session_id_carries_a_first_turn() -> None:
    stage = SessionStage(SessionStore(None))
    await _turn(stage, _conversation(("plan a trip", "")), "large", header="s-1")
    ctx = await _turn(stage, _conversation(("hi", "")), "small", header="s-1")
    assert (ctx.route.tier.name, ctx.route.session_route) == ("large", "held")
    fresh = await _turn(stage, _conversation(("hi", "")), "small", header="s-2")
    assert (fresh.route.tier.name, fresh.route.session_route) == ("small", "new")


@pytest.mark.parametrize("body", [
    {**_chat("named"), "model": "small"},  # a tier named by the client is the client's choice
])
async def test_the_stage_leaves_alone_what_is_not_auto(body: dict) -> None:
    stage = SessionStage(SessionStore(None))
    ctx = await _turn(stage, body, "small")
    assert ctx.route.session is None and ctx.route.session_route is None


async def test_without_a_sessions_policy_nothing_is_recorded() -> None:
    store = SessionStore(None)
    config = gateway_config([tier("small", ["http://127.0.0.1:9/v1"])])
    ctx = await _turn(SessionStage(store), _chat("hi"), "small", config)
    assert ctx.route.session is None and await store.peek("anything") is None


def test_a_conversation_digest_starts_from_the_tenant_alone_every_time() -> None:
    """`conversation_digest` is a copy of the tenant's seeded digest: using one leaves the next one as new."""
    from hashlib import blake2b

    from gateway.routing.sessions import conversation_digest

    used = conversation_digest("alice")
    used.update(b"a message")
    assert conversation_digest("alice").hexdigest() == blake2b(b"alice\x00v", digest_size=16).hexdigest()
    assert conversation_digest("bob").hexdigest() != conversation_digest("alice").hexdigest()
