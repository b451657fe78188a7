"""Session ids and conversation keys, to the byte (issue 42: mutants of gateway/routing/sessions.py that the
session tests let survive). The ids are a stored format: `sess:<id>` in Redis is shared by every gateway replica,
so a replica that derived them differently (another prefix, digest size or encoding) would lose every sticky
session in a rolling upgrade. Each derivation is written out here from its docstring."""

from __future__ import annotations

from hashlib import blake2b
from typing import Any

from gateway.reading import read
from gateway.routing.sessions import conversation_keys, header_key, redis_key, session_id


def digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()


def chat(*messages: tuple[str, str], **fields: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": r, "content": c} for r, c in messages], **fields}


def conversation(tenant: str, *parts: tuple[int, str, str]) -> blake2b:
    d = blake2b(tenant.encode() + b"\x00v", digest_size=16)
    for turn, role, text in parts:
        d.update(f"{turn}\x1f{role}\x1f" "text\x1f".encode())
        d.update(text.encode("utf-8", "surrogatepass"))
        d.update(b"\x1e")
    return d


def test_a_header_names_the_session_within_the_tenant() -> None:
    assert header_key("acme", "abc") == digest(b"acme\x00habc")
    assert len(header_key("acme", "abc")) == 32
    assert header_key("acme", "x" * 300) == digest(b"acme\x00h" + b"x" * 256)  # at most 256 characters
    assert header_key("acme", "\ud800") == digest(b"acme\x00h" + "\ud800".encode("utf-8", "surrogatepass"))
    assert session_id("acme", "abc", chat(("user", "hi"))) == header_key("acme", "abc")
    assert redis_key("0123") == "sess:0123"


def test_without_a_header_the_user_system_and_first_message_name_it() -> None:
    body = chat(("system", "be brief"), ("user", "hi"), ("assistant", "hello"), ("user", "more"), user="u1")
    assert session_id("acme", None, body) == digest(b"acme\x00cu1\x00be brief\x00hi")
    assert session_id("acme", None, chat(("user", "hi"), user=5)) == digest(b"acme\x00c\x00\x00hi")  # no str user
    assert session_id("acme", None, chat(("system", "only"))) == digest(b"acme\x00c\x00only\x00")
    assert session_id("acme", None, chat(("user", "\udfff"))) == digest(
        b"acme\x00c\x00\x00" + "\udfff".encode("utf-8", "surrogatepass"))
    assert session_id("acme", None, {"model": "auto", "messages": []}) is None


def test_conversation_keys_of_a_first_turn() -> None:
    keys = conversation_keys("acme", read("chat", chat(("system", "s"), ("user", "a"), ("user", "b\ud800"))))
    assert keys.lookup is None  # no assistant reply: continues nothing
    assert keys.next_turn == 3
    assert keys.current() == conversation("acme", (0, "system", "s"), (1, "user", "a"), (2, "user", "b\ud800")) \
        .hexdigest()
    after = conversation("acme", (0, "system", "s"), (1, "user", "a"), (2, "user", "b\ud800"), (3, "assistant", "ok"))
    assert keys.answered("ok") == after.hexdigest()
    assert len(keys.current()) == 32


def test_the_next_turn_looks_up_the_conversation_through_the_last_reply() -> None:
    first = conversation_keys("acme", read("chat", chat(("user", "hi"))))
    second = conversation_keys("acme", read("chat", chat(("user", "hi"), ("assistant", "hello"), ("user", "more"))))
    assert second.lookup == first.answered("hello")
    assert second.next_turn == 3


def test_a_conversation_opened_by_the_assistant() -> None:
    keys = conversation_keys("acme", read("chat", chat(("assistant", "welcome"), ("user", "hi"))))
    assert keys.lookup == conversation("acme", (0, "assistant", "welcome")).hexdigest()  # a reply at turn 0


def test_a_conversation_that_ends_with_the_reply_looks_itself_up() -> None:
    keys = conversation_keys("acme", read("chat", chat(("user", "hi"), ("assistant", "hello"))))
    assert keys.lookup == keys.current() == conversation("acme", (0, "user", "hi"), (1, "assistant", "hello")) \
        .hexdigest()


def test_no_messages_no_turns() -> None:
    keys = conversation_keys("acme", read("chat", {"model": "auto", "messages": []}))
    assert (keys.lookup, keys.next_turn) == (None, 0)
    assert keys.answered("x") == conversation("acme", (0, "assistant", "x")).hexdigest()


# --- the store: the tier a session holds, in process and in Redis ---

import time  # noqa: E402

from redis.asyncio import Redis  # noqa: E402

from gateway.cache.connection import connect  # noqa: E402
from gateway.cache.guard import RedisGuard  # noqa: E402
from gateway.routing.sessions import Held, LocalSessions, SessionStore, _parse  # noqa: E402


def test_a_conversation_of_one_reply_looks_itself_up() -> None:
    keys = conversation_keys("acme", read("chat", chat(("assistant", "welcome"))))
    assert keys.lookup == keys.current()


def test_held_here_only_moves_up_and_expires() -> None:
    store = SessionStore(None)
    store.hold_here("k", Held(2, "medium"), 60)
    now = time.monotonic()
    assert store.local.get("k", now) == Held(2, "medium")
    store.hold_here("k", Held(1, "small"), 60)
    assert store.local.get("k", now) == Held(2, "medium")  # never down
    store.hold_here("k", Held(3, "large"), 60)
    assert store.local.get("k", now) == Held(3, "large")
    assert store.local.get("k", now + 61) is None  # its TTL
    assert store.local.get("other", now) is None


def test_local_sessions_keep_their_size() -> None:
    local = LocalSessions(size=2)
    far = time.monotonic() + 60
    local.put("a", Held(0, "s"), far)
    local.put("b", Held(0, "s"), far)
    assert local.get("a", 0.0) == Held(0, "s")  # two of two: both kept
    local.put("c", Held(0, "s"), far)
    assert local.get("b", 0.0) is None or local.get("a", 0.0) is None
    assert local.get("c", 0.0) == Held(0, "s")


def test_parse_reads_rank_and_tier() -> None:
    assert _parse(b"2|medium") == Held(2, "medium")
    assert _parse("-1|t") == Held(-1, "t")
    assert _parse(b"x|t") is None and _parse(b"nobar") is None and _parse(None) is None and _parse(5) is None


async def test_hold_in_redis_and_peek(redis_url: str) -> None:
    guard = RedisGuard(connect(redis_url), op_timeout_s=1.0)
    store = SessionStore(guard)
    assert await store.hold("k", Held(1, "small"), 60) == (Held(1, "small"), None)  # new
    assert await store.hold("k", Held(0, "tiny"), 60) == (Held(1, "small"), Held(1, "small"))  # never down
    other = SessionStore(guard)  # another replica: Redis tells it
    assert await other.peek("k") == Held(1, "small")
    assert await other.hold("k", Held(2, "medium"), 60) == (Held(2, "medium"), Held(1, "small"))
    assert await store.peek("k") == Held(2, "medium")
    count = guard.registry.get_sample_value
    assert count("gateway_redis_op_seconds_count", {"op": "session_hold"}) == 3
    assert count("gateway_redis_op_seconds_count", {"op": "session_peek"}) == 2
    redis = Redis.from_url(redis_url)
    await redis.flushall()  # Redis forgets; this replica still knows what it held itself (peek records nothing)
    assert await store.hold("k", Held(0, "tiny"), 60) == (Held(1, "small"), Held(1, "small"))
    assert await SessionStore(None).peek("k") is None
    await redis.aclose()
