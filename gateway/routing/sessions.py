"""Sticky-tier sessions: which tier a conversation holds, shared by the gateway's replicas (issue 32).

A conversation is named by its `x-session-id` header, else by the request's `user` together with a hash of
its system prompt and first user message (what every turn of a chat repeats; `experiments.assign` reads the
same two texts). `session_id` turns either into a short id, per tenant.

`SessionStore.hold` records the tier a turn was routed to and answers the tier the session holds: the
higher of the two by the tiers' order in routes (cheapest first), so a session only ever moves up. In Redis
one Lua call does it atomically (`sess:<id>` = "<rank>|<tier>", its TTL renewed on every turn), so two
gateway replicas serving turns of one chat agree; without Redis, or while it is down, an in-process map
does, and it also remembers what Redis answered, so a turn served while Redis was away never moves the
session down when it comes back.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from gateway.cache.guard import RedisGuard
from gateway.experiments.assign import KEY_CHARS, _conversation

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
    """The conversation's id (32 hex characters) within `tenant`; None when the request names none (no header,
    and neither a `user` nor any prompt text)."""
    if header:
        data = b"h" + header[:MAX_HEADER_CHARS].encode("utf-8", "surrogatepass")
    else:
        system, first = _conversation(body)
        user = body.get("user")
        user = user if type(user) is str else ""
        if not (system or first):
            return None
        text = f"{user[:KEY_CHARS]}\x00{system[:KEY_CHARS]}\x00{first[:KEY_CHARS]}"
        data = b"c" + text.encode("utf-8", "surrogatepass")
    return blake2b(tenant.encode() + b"\x00" + data, digest_size=16).hexdigest()


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
            reply = await self._guard.run("session_hold", lambda: script(keys=keys, args=args))
            if isinstance(reply, list) and len(reply) == 2:
                shared, earlier = _parse(reply[0]), _parse(reply[1])
                if shared is not None and shared.rank >= best.rank:
                    best = shared
                if earlier is not None and (before is None or earlier.rank > before.rank):
                    before = earlier
        self.local.put(key, best, now + ttl_s)
        return best, before

    async def peek(self, key: str) -> Held | None:
        """The tier session `key` holds, without recording a turn (for `route explain`)."""
        if self._guard is not None:
            client = self._guard.client
            shared = _parse(await self._guard.run("session_peek", lambda: client.get(redis_key(key))))
            if shared is not None:
                return shared
        return self.local.get(key, time.monotonic())


def _parse(reply: object) -> Held | None:
    text = reply.decode() if isinstance(reply, bytes) else reply
    if not isinstance(text, str) or "|" not in text:
        return None
    rank, _, tier = text.partition("|")
    return Held(int(rank), tier) if rank.lstrip("-").isdigit() else None
