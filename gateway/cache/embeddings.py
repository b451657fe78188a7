"""Embeddings in Redis, so a text seen by any gateway replica is not encoded again.

Two kinds of entries, both `emb:<key>` with a TTL:
- the in-process encoders' (classifier, semantic cache, the MiniLM embedding tier): float16 bytes
  (768 bytes for 384 dimensions; float16 keeps ~3 significant digits, far below what a cosine
  threshold or a difficulty score can tell apart), under the caller's content hashes;
- remote embedding tiers' (`Vectors`): float32 bytes, exactly what the backend sent, under
  `vector_key(scope, model, dimensions, text)`: the tenant scope, the served model, the vector length and the
  exact text (no normalization: a remote tokenizer may see whitespace), so two tiers serving one model share.
Every serving key names a tenant scope (gateway.keyspace): a text one tenant embedded is another tenant's
miss (no `cache: hit` at $0 that would tell it what others embedded), unless their policies share the cache.
`get_many` is one MGET (per slot group in a cluster, via `mget_nonatomic`), `put_many` one pipeline
of SET EX; nothing is sent for an empty input. A value of the wrong length reads as missing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from redis.asyncio.cluster import RedisCluster

from gateway.cache.background import BackgroundWrites
from gateway.cache.guard import RedisGuard

Vector = npt.NDArray[np.float32]


def encode(vector: npt.NDArray[Any], dtype: str = "<f2") -> bytes:
    return np.asarray(vector, dtype=dtype).tobytes()


def decode(raw: object, dim: int, dtype: str = "<f2") -> Vector | None:
    """The float32 vector in `raw`, or None unless it holds exactly `dim` values of `dtype`."""
    if not isinstance(raw, bytes) or len(raw) != np.dtype(dtype).itemsize * dim:
        return None
    return np.frombuffer(raw, dtype=dtype).astype(np.float32)


def vector_key(scope: str, model: str, dimensions: int, text: str) -> str:
    """The key of a remote model's vector of `text` for a tenant scope: SHA-256 of the scope, the model, the
    vector length and the exact text."""
    return "v:" + hashlib.sha256(orjson.dumps([scope, model, dimensions, text])).hexdigest()


def store_key(key: str) -> str:
    """The Redis key of an embedding stored under `key` (a scoped content hash, or a `vector_key`)."""
    return f"emb:{key}"


class EmbeddingStore:
    """Content hash -> embedding, shared by every gateway replica, expiring after `ttl_s`; values are `dim`
    numbers of `dtype` (float16 unless told)."""

    def __init__(self, guard: RedisGuard, ttl_s: int = 86400, dim: int = 384, dtype: str = "<f2") -> None:
        self.guard = guard
        self.ttl_s = ttl_s
        self.dim = dim
        self.dtype = dtype

    async def get_many(self, keys: Sequence[str]) -> list[Vector | None]:
        """The stored vector of each key, None where missing, malformed or Redis is down."""
        if not keys:
            return []
        names = [store_key(key) for key in keys]
        client = self.guard.client
        if isinstance(client, RedisCluster):
            cluster = client
            values = await self.guard.run("embedding_get", lambda: cluster.mget_nonatomic(names), key=names)
        else:
            single = client
            values = await self.guard.run("embedding_get", lambda: single.mget(names), key=names)
        if values is None:
            return [None] * len(keys)
        return [decode(raw, self.dim, self.dtype) for raw in values]

    async def put_many(self, items: Sequence[tuple[str, npt.NDArray[Any]]]) -> None:
        """Store each (key, vector) with the TTL, in one round trip."""
        if items:
            await self.guard.run("embedding_put", lambda: self._set_all(items),
                                 key=[store_key(key) for key, _ in items])

    async def _set_all(self, items: Sequence[tuple[str, npt.NDArray[Any]]]) -> list[Any]:
        async with self.guard.client.pipeline(transaction=False) as pipe:
            for key, vector in items:
                pipe.set(store_key(key), encode(vector, self.dtype), ex=self.ttl_s)
            result: list[Any] = await pipe.execute()
            return result


class Vectors:
    """Remote embedding tiers' vectors: float32, keyed by (tenant scope, served model, dimensions, text); written
    after the answer."""

    def __init__(self, guard: RedisGuard, writes: BackgroundWrites, ttl_s: int = 86400) -> None:
        self._guard = guard
        self._writes = writes
        self._ttl_s = ttl_s

    def _store(self, dimensions: int) -> EmbeddingStore:
        return EmbeddingStore(self._guard, self._ttl_s, dimensions, "<f4")

    async def get_many(self, scope: str, model: str, dimensions: int, texts: Sequence[str]) -> list[Vector | None]:
        """Each text's stored vector in `scope`, None where missing (or Redis is down)."""
        return await self._store(dimensions).get_many([vector_key(scope, model, dimensions, t) for t in texts])

    def put_later(self, scope: str, model: str, dimensions: int, items: Sequence[tuple[str, Vector]]) -> None:
        """Store each (text, vector) in `scope`, in the background, in one round trip."""
        if items:
            keyed = [(vector_key(scope, model, dimensions, text), vector) for text, vector in items]
            self._writes.spawn(self._store(dimensions).put_many(keyed))
