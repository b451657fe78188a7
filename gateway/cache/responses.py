"""The exact response cache in Redis: one GET on lookup, one SET EX on store, both guarded."""

from __future__ import annotations

from gateway.cache.answers import CachedAnswer
from gateway.cache.background import BackgroundWrites
from gateway.cache.guard import RedisGuard


class ResponseCache:
    def __init__(self, guard: RedisGuard, writes: BackgroundWrites) -> None:
        self._client = guard.client
        self._guard = guard
        self._writes = writes

    async def get(self, key: str) -> CachedAnswer | None:
        raw = await self._guard.run("cache_get", lambda: self._client.get(key), key=key)
        return CachedAnswer.from_bytes(raw) if isinstance(raw, bytes) else None

    def put_later(self, key: str, answer: CachedAnswer, ttl_s: int) -> None:
        """Store in the background: the client already has its answer and must not wait for Redis."""
        data = answer.to_bytes()
        self._writes.spawn(self._guard.run("cache_put", lambda: self._client.set(key, data, ex=ttl_s), key=key))
