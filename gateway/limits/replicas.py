"""Replicas: how many gateways share this Redis, so that each knows its share of a limit when Redis is down.

Each gateway writes a heartbeat every `every_s` into one sorted set (member: its random id, score:
Redis's clock) and reads back how many wrote one in the last `FORGET_AFTER` beats. The count it last
saw survives a Redis outage: that is when it is needed. `count` never goes below the configured
`redis.expected_replicas` (the only source when Redis was never reachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

from gateway.cache.guard import RedisGuard

KEY = "gw:replicas"
FORGET_AFTER = 3  # beats missed before a replica no longer counts

# KEYS: the set   ARGV: my id, seconds after which a silent replica is forgotten   returns: the live count
BEAT_LUA = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
redis.call('ZADD', KEYS[1], t, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t - tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return redis.call('ZCARD', KEYS[1])
"""


class Replicas:
    def __init__(self, guard: RedisGuard | None, expected: Callable[[], int], *, every_s: float = 2.0) -> None:
        self._guard = guard
        self._expected = expected
        self.every_s = every_s
        self.id = os.urandom(8).hex()
        self.seen = 1  # at the last heartbeat that got an answer (this one included)
        self._script = guard.client.register_script(BEAT_LUA) if guard else None

    @property
    def count(self) -> int:
        """The replicas to share a limit with: as many as last seen, at least `expected_replicas`."""
        return max(self.seen, self._expected())

    async def beat(self) -> None:
        if self._guard is None or self._script is None:
            return
        script, args = self._script, [self.id, str(self.every_s * FORGET_AFTER)]
        live: Any = await self._guard.run("replicas_beat", lambda: script(keys=[KEY], args=args), self.every_s,
                                         key=KEY)
        if live is not None:
            self.seen = max(1, int(live))

    async def leave(self) -> None:
        """Take this replica out of the count at once (shutdown) rather than after FORGET_AFTER beats."""
        if self._guard is not None:
            client = self._guard.client
            await self._guard.run("replicas_leave", lambda: client.zrem(KEY, self.id), key=KEY)

    async def run(self, stop: asyncio.Event) -> None:
        """Beat every `every_s` until `stop` is set, then leave."""
        while not stop.is_set():
            await self.beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every_s)
        await self.leave()
