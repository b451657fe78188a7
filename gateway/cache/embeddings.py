"""Prompt embeddings in Redis, so a prompt seen by any gateway replica is not encoded again.

Values are the vector as float16 bytes (768 bytes for 384 dimensions; float16 keeps ~3 significant
digits, far below what a cosine threshold or a difficulty score can tell apart). Keys are the
caller's content hashes under `emb:`. `get_many` is one MGET (per slot group in a cluster, via
`mget_nonatomic`), `put_many` one pipeline of SET EX; nothing is sent for an empty input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from redis.asyncio.cluster import RedisCluster

from gateway.cache.guard import RedisGuard

Vector = npt.NDArray[np.float32]


def encode(vector: npt.NDArray[Any]) -> bytes:
    return np.asarray(vector, dtype="<f2").tobytes()


def decode(raw: object, dim: int) -> Vector | None:
    """The float32 vector in `raw`, or None unless it holds exactly `dim` float16 values."""
    if not isinstance(raw, bytes) or len(raw) != 2 * dim:
        return None
    return np.frombuffer(raw, dtype="<f2").astype(np.float32)


class EmbeddingStore:
    """Content hash -> embedding, shared by every gateway replica, expiring after `ttl_s`."""

    def __init__(self, guard: RedisGuard, ttl_s: int = 86400, dim: int = 384) -> None:
        self.guard = guard
        self.ttl_s = ttl_s
        self.dim = dim

    async def get_many(self, keys: Sequence[str]) -> list[Vector | None]:
        """The stored vector of each key, None where missing, malformed or Redis is down."""
        if not keys:
            return []
        names = [f"emb:{key}" for key in keys]
        client = self.guard.client
        if isinstance(client, RedisCluster):
            cluster = client
            values = await self.guard.run("embedding_get", lambda: cluster.mget_nonatomic(names))
        else:
            single = client
            values = await self.guard.run("embedding_get", lambda: single.mget(names))
        if values is None:
            return [None] * len(keys)
        return [decode(raw, self.dim) for raw in values]

    async def put_many(self, items: Sequence[tuple[str, npt.NDArray[Any]]]) -> None:
        """Store each (key, vector) with the TTL, in one round trip."""
        if items:
            await self.guard.run("embedding_put", lambda: self._set_all(items))

    async def _set_all(self, items: Sequence[tuple[str, npt.NDArray[Any]]]) -> list[Any]:
        async with self.guard.client.pipeline(transaction=False) as pipe:
            for key, vector in items:
                pipe.set(f"emb:{key}", encode(vector), ex=self.ttl_s)
            result: list[Any] = await pipe.execute()
            return result
