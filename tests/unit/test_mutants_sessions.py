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
