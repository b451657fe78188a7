"""Prompt embeddings for the serving path: in-process LRU, then a shared store, then the encoder.

    embedder = CachedEmbedder(MicroBatcher(encoder), namespace=namespace_of(path, file_sha256(path)))
    vector = await embedder.embedding(prompt, scope=tenant_scope)

A store (the Redis EmbeddingStore: any object with async get_many / put_many) that fails or
answers None is a miss, never an error; vectors the encoder computes are written back to it in the
background. Store keys are `<namespace>:<scoped content hash>`: the namespace names the encoder file, so
two encoders (the classifier's and the semantic cache's), or two versions of one during a rolling
deploy, never read each other's vectors; the hash names the caller's scope with the text
(`embedding_cache.scoped_key`): the tenant's, so a text one tenant sent is not another tenant's hit, in the
LRU or in Redis (gateway.keyspace). Offline callers (benches, training) pass OFFLINE_SCOPE.

`LazyEncoder` opens its ONNX session on the first call, in the caller's thread (the batcher's
executor), so an encoder that a policy may never use costs nothing until it does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt
import structlog

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.embedding_cache import EmbeddingCache, scoped_key
from gateway.classifier.encoder import EMBEDDING_DIM, EncoderSession
from gateway.keyspace import OFFLINE

log = structlog.get_logger("gateway.classifier")
Embedding = npt.NDArray[np.float32]
OFFLINE_SCOPE = OFFLINE  # benches, training, route tools: no tenant (a reserved name)


class SharedEmbeddings(Protocol):
    """A second-level embedding store shared by replicas (gateway.cache.embeddings.EmbeddingStore)."""

    async def get_many(self, keys: Sequence[str]) -> list[Embedding | None]: ...

    async def put_many(self, items: Sequence[tuple[str, Embedding]]) -> None: ...


class LazyEncoder:
    """An EncoderSession opened by `open_session` on the first `embed` (thread-safe)."""

    def __init__(self, open_session: Callable[[], EncoderSession]) -> None:
        self._open = open_session
        self._session: EncoderSession | None = None
        self._lock = threading.Lock()

    @property
    def session(self) -> EncoderSession | None:
        """The session once opened, else None."""
        return self._session

    def embed(self, texts: Sequence[str]) -> Embedding:
        if self._session is None:
            with self._lock:
                if self._session is None:
                    self._session = self._open()
        return self._session.embed(texts)


class CachedEmbedder:
    """`embedding(text)`: LRU, then the shared store, then the micro-batched encoder; `close()` when done."""

    def __init__(
        self,
        batcher: MicroBatcher,
        *,
        namespace: str,
        store: SharedEmbeddings | None = None,
        cache: EmbeddingCache | None = None,
    ) -> None:
        self.batcher = batcher
        self.namespace = namespace
        self.store = store
        self.cache = cache or EmbeddingCache()
        self.store_hits = 0
        self.encoded = 0
        self._writes: set[asyncio.Task[None]] = set()

    async def embedding(self, text: str, *, scope: str) -> Embedding:
        """The prompt's read-only embedding (384,), cached in `scope` (a tenant's: gateway.keyspace)."""
        (embedding,), _ = await self.embed_many([text], scope=scope)
        return embedding

    async def embed_many(self, texts: Sequence[str], *, scope: str) -> tuple[list[Embedding], int]:
        """Each text's read-only embedding, and how many texts the encoder computed (the others were cached in
        `scope`; a text repeated in `texts` is encoded once). The store is asked once for all LRU misses."""
        keys = [scoped_key(scope, text) for text in texts]
        found: dict[str, Embedding] = {}
        for key in keys:
            if key not in found and (hit := self.cache.get(key)) is not None:
                found[key] = hit
        missing = {key: text for key, text in zip(keys, texts) if key not in found}
        if missing and self.store is not None:
            shared = await self._from_store(self.store, [f"{self.namespace}:{key}" for key in missing])
            for key, vector in zip(list(missing), shared):
                if vector is not None:
                    self.store_hits += 1
                    found[key] = self.cache.put(key, vector)
                    del missing[key]
        encoded = await asyncio.gather(*(self.batcher.embed(text) for text in missing.values()))
        for key, vector in zip(missing, encoded):
            found[key] = self.cache.put(key, vector)
        self.encoded += len(missing)
        if missing and self.store is not None:
            items = [(f"{self.namespace}:{key}", found[key]) for key in missing]
            task = asyncio.get_running_loop().create_task(self._to_store(self.store, items))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return [found[key] for key in keys], len(missing)

    @staticmethod
    async def _from_store(store: SharedEmbeddings, keys: list[str]) -> list[Embedding | None]:
        try:
            found = await store.get_many(keys)
        except Exception as err:  # the store is an accelerator: a failure is a miss
            log.warning("embedding_store_get_failed", error=f"{type(err).__name__}: {err}")
            return [None] * len(keys)
        return [None if f is None or np.shape(f) != (EMBEDDING_DIM,) else np.asarray(f, dtype=np.float32)
                for f in found]

    @staticmethod
    async def _to_store(store: SharedEmbeddings, items: list[tuple[str, Embedding]]) -> None:
        try:
            await store.put_many(items)
        except Exception as err:
            log.warning("embedding_store_put_failed", error=f"{type(err).__name__}: {err}")

    async def drain(self) -> None:
        """Wait for the background writes to the shared store."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def close(self) -> None:
        """Stop the batcher and cancel pending store writes."""
        self.batcher.close()
        for task in list(self._writes):
            task.cancel()

    async def aclose(self) -> None:
        """Finish the store writes, then close."""
        await self.drain()
        self.close()
