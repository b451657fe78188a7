"""Sticky-tier sessions: which tier a conversation holds, shared by the gateway's replicas (issue 32, issue 38).

A conversation is named by its `x-session-id` header, else by the conversation so far: the digest of every
message's role and content, the assistant's replies included (`ConversationKeys`). A first turn (no assistant
reply yet) continues no session without a header: it inherits nothing, so two chats that open alike ("hi", a
fixed few-shot prefix) are two conversations. After a turn is answered, the conversation through that answer is
recorded with the tier the turn was served at; the next turn, which repeats the conversation and adds a user
message, finds it by the prefix through the last assistant reply. A conversation that goes on from a reply the
gateway did not give (edited, or from another model) starts anew.

`SessionStore.hold` records the tier a session holds: the higher of the recorded and the given by the tiers' order
in routes (cheapest first), so a session only ever moves up. In Redis one Lua call does it atomically
(`sess:<id>` = "<rank>|<tier>", its TTL renewed on every turn), so two gateway replicas serving turns of one chat
agree; without Redis, or while it is down, an in-process map does, and it also remembers what Redis answered, so
a turn served while Redis was away never moves the session down when it comes back.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from hashlib import blake2b
from typing import Any, NamedTuple

import orjson

from gateway.cache.guard import RedisGuard
from gateway.conversation import MESSAGE_ROLES
from gateway.experiments.assign import KEY_CHARS, conversation_texts
from gateway.reading import Part, Reading

SESSION_HEADER = "x-session-id"
MAX_HEADER_CHARS = 256
LOCAL_SESSIONS = 100_000  # in-process entries kept (least recently used dropped first)

HOLD_LUA = """
local current = redis.call('GET', KEYS[1])
if current then
  local bar = string.find(current, '|', 1, true)
  if bar and tonumber(string.sub(current, 1, bar - 1)) >= tonumber(ARGV[1]) then
    redis.call('EXPIRE', KEYS[1], ARGV[3])
    return {current, current}
  end
end
local value = ARGV[1] .. '|' .. ARGV[2]
redis.call('SET', KEYS[1], value, 'EX', ARGV[3])
return {value, current or ''}
"""



def session_id(tenant: str, header: str | None, body: Mapping[str, Any]) -> str | None:
    """A conversation's id for logs and replays (32 hex characters) within `tenant`: its x-session-id, else its
    `user`, system prompt and first user message; None when the request names none. (Routing keys a session by
    the conversation so far: `ConversationKeys`.)"""
    if header:
        return header_key(tenant, header)
    user = body.get("user")
    return conversation_id(tenant, user if type(user) is str else "", *conversation_texts(body))


def conversation_id(tenant: str, user: str, system: str, first: str) -> str | None:
    """`session_id` without a header, from the `user` field and `conversation_texts`."""
    if not (system or first):
        return None
    text = f"{user[:KEY_CHARS]}\x00{system[:KEY_CHARS]}\x00{first[:KEY_CHARS]}"
    return blake2b(tenant.encode() + b"\x00c" + text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def header_key(tenant: str, header: str) -> str:
    """The session an explicit x-session-id names, within `tenant`."""
    data = b"h" + header[:MAX_HEADER_CHARS].encode("utf-8", "surrogatepass")
    return blake2b(tenant.encode() + b"\x00" + data, digest_size=16).hexdigest()


class ConversationKeys(NamedTuple):
    """A turn's session keys when no header names one: `lookup`, the conversation through its last assistant
    reply (None: a first turn, which continues no session), and the running digest of the whole conversation,
    which `answered` completes with the reply to give the key the next turn looks up."""

    lookup: str | None
    digest: Any  # blake2b of every message so far
    next_turn: int

    def current(self) -> str:
        """The conversation through this request's last message (a first turn's id in logs)."""
        return str(self.digest.hexdigest())

    def answered(self, reply: str) -> str:
        """The key of the conversation once `reply` (the assistant's answer text) is added."""
        digest = self.digest.copy()
        update_digest(digest, Part("text", "assistant", reply, self.next_turn))
        return str(digest.hexdigest())


def conversation_keys(tenant: str, reading: Reading) -> ConversationKeys:
    """The session keys of a chat request's conversation (see ConversationKeys)."""
    parts = [part for part in reading.parts if part.role in MESSAGE_ROLES]
    upto = max((part.turn for part in parts if part.role == "assistant"), default=-1)
    digest = conversation_digest(tenant)
    lookup = None
    for part in parts:
        if lookup is None and upto >= 0 and part.turn > upto:
            lookup = digest.hexdigest()  # the conversation through its last assistant reply
        update_digest(digest, part)
    if lookup is None and upto >= 0:
        lookup = digest.hexdigest()  # (it ends with the reply: no user turn after it)
    return ConversationKeys(lookup, digest, parts[-1].turn + 1 if parts else 0)


@lru_cache(maxsize=4096)
def _tenant_seed(tenant: str) -> Any:
    return blake2b(tenant.encode() + b"\x00v", digest_size=16)


def conversation_digest(tenant: str) -> Any:
    """A fresh session digest of a conversation of `tenant`'s (blake2b over the tenant's name, then each message
    part by `update_digest`): a copy of the tenant's seeded one, at about half the cost of starting one."""
    return _tenant_seed(tenant).copy()


def update_digest(digest: Any, part: Part) -> None:
    """Feed one part of a conversation into a session digest (turn, role, kind, value): the same bytes wherever
    a conversation is digested (the session step, and `gateway whatif` linking logged turns)."""
    value = part.value if isinstance(part.value, str) else orjson.dumps(part.value).decode()
    # one update: the header's characters (a number, a role, a kind) encode alike with or without surrogatepass
    digest.update(f"{part.turn}\x1f{part.role}\x1f{part.kind}\x1f{value}\x1e".encode("utf-8", "surrogatepass"))


def redis_key(session: str) -> str:
    """The Redis key of a session id (`session_id`: it names the tenant)."""
    return f"sess:{session}"


@dataclass(frozen=True, slots=True)
class Held:
    """A session's tier: its rank (position in routes) and name."""

    rank: int
    tier: str


class LocalSessions:
    """Sessions in process: the fallback without Redis, and the floor of what Redis says."""

    def __init__(self, size: int = LOCAL_SESSIONS) -> None:
        self._size = size
        self._entries: OrderedDict[str, tuple[Held, float]] = OrderedDict()

    def get(self, key: str, now: float) -> Held | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= now:
            del self._entries[key]
            return None
        return entry[0]

    def put(self, key: str, held: Held, expires: float) -> None:
        self._entries[key] = (held, expires)
        self._entries.move_to_end(key)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)


class SessionStore:
    """The tier each session holds (see the module docstring)."""

    def __init__(self, guard: RedisGuard | None, local: LocalSessions | None = None) -> None:
        self._guard = guard
        self._script = guard.client.register_script(HOLD_LUA) if guard is not None else None
        self.local = local or LocalSessions()

    async def hold(self, key: str, routed: Held, ttl_s: int) -> tuple[Held, Held | None]:
        """Record that a turn of session `key` was routed to `routed`: the tier the session holds now (never
        lower than before, nor than `routed`), and the one it held before this turn (None: a new session).
        Renews the session's TTL."""
        now = time.monotonic()
        before = self.local.get(key, now)
        best = routed if before is None or routed.rank > before.rank else before
        if self._guard is not None and self._script is not None:
            script, keys, args = self._script, [redis_key(key)], [str(best.rank), best.tier, str(ttl_s)]
            reply = await self._guard.run("session_hold", lambda: script(keys=keys, args=args), key=keys)
            if isinstance(reply, list) and len(reply) == 2:
                shared, earlier = _parse(reply[0]), _parse(reply[1])
                if shared is not None and shared.rank >= best.rank:
                    best = shared
                if earlier is not None and (before is None or earlier.rank > before.rank):
                    before = earlier
        self.local.put(key, best, now + ttl_s)
        return best, before

    def hold_here(self, key: str, held: Held, ttl_s: int) -> None:
        """`hold` in process only, at once (Redis follows by `hold` in the background)."""
        now = time.monotonic()
        before = self.local.get(key, now)
        self.local.put(key, held if before is None or held.rank > before.rank else before, now + ttl_s)

    async def peek(self, key: str) -> Held | None:
        """The tier session `key` holds, without recording a turn (for `route explain`)."""
        if self._guard is not None:
            client, name = self._guard.client, redis_key(key)
            shared = _parse(await self._guard.run("session_peek", lambda: client.get(name), key=name))
            if shared is not None:
                return shared
        return self.local.get(key, time.monotonic())


def _parse(reply: object) -> Held | None:
    text = reply.decode() if isinstance(reply, bytes) else reply
    if not isinstance(text, str) or "|" not in text:
        return None
    rank, _, tier = text.partition("|")
    return Held(int(rank), tier) if rank.lstrip("-").isdigit() else None
