"""In-process LRU of prompt embeddings, keyed by the SHA-256 of a scope and the normalized text.

Normalization collapses whitespace runs and strips the ends: the encoder's tokenizer splits on
whitespace, so such texts have the same tokens and the same embedding. The key is a hex string,
so a shared (Redis) layer can sit behind this one with the same keys.

On the serving path every key names its scope (`scoped_key`): a tenant's own (its name, or the shared scope
when its policy shares the cache; gateway.keyspace), so one tenant's texts are never another's hits. The
unscoped `cache_key` is the offline one (training's embedding files), never a serving key.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import numpy.typing as npt

Embedding = npt.NDArray[np.float32]


def cache_key(text: str) -> str:
    """SHA-256 (hex) of `text` with whitespace runs collapsed to one space and the ends stripped."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8", "surrogatepass")).hexdigest()


def scoped_key(scope: str, text: str) -> str:
    """SHA-256 (hex) of `scope` (length-prefixed: no two scopes and texts make one string) and `text` normalized
    as `cache_key` normalizes it: the serving key of an embedding, per tenant scope (gateway.keyspace)."""
    normalized = " ".join(text.split())
    return hashlib.sha256(f"{len(scope)}:{scope}:{normalized}".encode("utf-8", "surrogatepass")).hexdigest()


class EmbeddingCache:
    """Bounded LRU: `get` counts a hit or a miss; stored arrays are read-only."""

    def __init__(self, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, Embedding] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Whether `key` is cached; a peek: no hit or miss is counted and the LRU order stays."""
        return key in self._entries

    def get(self, key: str) -> Embedding | None:
        embedding = self._entries.get(key)
        if embedding is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return embedding

    def put(self, key: str, embedding: Embedding) -> Embedding:
        """Store a read-only copy (evicting the least recently used); returns the stored array."""
        stored = np.array(embedding, dtype=np.float32, copy=True)
        stored.flags.writeable = False
        self._entries[key] = stored
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return stored

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
