"""A conversation's identity within its tenant, from the request's reading: what experiments stick to and what
the request log links turns by (`gateway whatif` replays sessions and arms from it), without its text.

The conversation is the reading's message parts (`Reading.parts` whose role is a message's or a completion
prompt's: not tool definitions), in order; a prefix of it is named by the digest of the tenant and those parts:
blake2b-128 over a per-tenant seed and the parts' JSON (each part as [kind, role, value, turn]). One
serialization and one hash name a prefix, however long the conversation (a per-part loop of updates costs a
few thousand instructions a message in Python). Three prefixes matter:

    current   through the request's last message
    parent    through the message before its last assistant reply: the `current` of the turn that reply
              answered (None: no reply yet, a first turn)
    start     through its first user message (a completion: its first prompt), and whatever came before it
              (system, developer): the same for every turn of one conversation, and as 64 bits (the first
              eight bytes, little-endian) the experiments' sticky key by conversation (`start_key`)

A first turn's three are one hash. Two requests with the same parts have the same keys whatever the body's
shape: a string content and one text content part are the same part (`gateway.reading`).
"""

from __future__ import annotations

from functools import lru_cache
from hashlib import blake2b
from typing import Any

import orjson

from gateway.reading import Part

MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
CONVERSATION_ROLES = MESSAGE_ROLES | {"prompt"}
OPENING_ROLES = ("user", "prompt")  # the message that opens a conversation after its instructions


def turn_keys(tenant: str, parts: tuple[Part, ...]) -> tuple[str | None, str, int | None]:
    """(parent, current, start_key) of the conversation `parts` hold (the module docstring): parent and current
    as 32 hex characters, the start as a 64-bit integer (None: no message at all)."""
    messages, opened, reply = _conversation(parts)
    whole = _digest(tenant, messages)
    start = whole if opened == len(messages) else _digest(tenant, messages[:opened])
    parent = None if reply < 0 else _digest(tenant, messages[:reply]).hex()
    return parent, whole.hex(), int.from_bytes(start[:8], "little") if messages else None


def start_key(tenant: str, parts: tuple[Part, ...]) -> int | None:
    """The conversation's start as 64 bits (`turn_keys`' third): None without any message."""
    messages, opened, _ = _conversation(parts)
    return int.from_bytes(_digest(tenant, messages[:opened])[:8], "little") if messages else None


def _conversation(parts: tuple[Part, ...]) -> tuple[list[Part], int, int]:
    """The message parts; how many of them the start holds (through the opening message's turn; all of them
    when none opens); the index of the last assistant reply's first part (-1: none)."""
    messages: list[Part] = []
    opening = opened = reply = reply_turn = -1
    for part in parts:  # (one loop: the roles and the cuts at once)
        role = part.role
        if role not in CONVERSATION_ROLES:
            continue
        turn = part.turn
        if opened < 0 <= opening and turn != opening:
            opened = len(messages)  # the first part after the opening message
        if role == "assistant":
            if turn != reply_turn:
                reply, reply_turn = len(messages), turn
        elif opening < 0 and role in OPENING_ROLES:
            opening = turn
        messages.append(part)
    return messages, len(messages) if opened < 0 else opened, reply


def _digest(tenant: str, messages: list[Part]) -> bytes:
    digest = _seed(tenant).copy()
    digest.update(orjson.dumps(messages, default=tuple))
    whole: bytes = digest.digest()
    return whole


@lru_cache(maxsize=4096)
def _seed(tenant: str) -> Any:
    """The tenant's seeded blake2b: a copy costs about half a new one (gateway.routing.sessions does the same)."""
    return blake2b(b"conversation\x00" + tenant.encode("utf-8", "surrogatepass") + b"\x00", digest_size=16)
