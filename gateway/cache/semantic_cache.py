"""The semantic cache (opt-in per policy): a paraphrase of a cached prompt gets the cached answer.

The embedding of the request's paraphrasable text (`Reading.semantic_text`: the last user turn of plain text,
or one string prompt; requests without one are never semantic hits) is looked up in a Redis vector set per
namespace (tenant scope, tier, and the rest of the reading: earlier turns, media, tools, parameters); a hit needs cosine similarity >=
the policy's threshold and the exact entry it points to still alive. Measured precision is modest
(docs/BENCHMARKS.md): near-misses such as swapped units score as high as paraphrases.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

import numpy as np

from gateway.cache.answers import CachedAnswer
from gateway.cache.background import BackgroundWrites
from gateway.cache.keys import semantic_namespace
from gateway.cache.responses import ResponseCache
from gateway.cache.semantic import SemanticIndex
from gateway.config.policies import SemanticRule
from gateway.reading import Reading


class Embed(Protocol):
    """The sentence encoder: a text's embedding, cached in the tenant's scope (gateway.keyspace)."""

    def __call__(self, text: str, *, scope: str) -> Awaitable[np.ndarray[Any, Any]]: ...


class SemanticCache:
    def __init__(self, index: SemanticIndex, embed: Embed, responses: ResponseCache, writes: BackgroundWrites) -> None:
        self._index = index
        self._embed = embed
        self._responses = responses
        self._writes = writes

    async def lookup(self, scope: str, tier: str, reading: Reading,
                     rule: SemanticRule) -> tuple[CachedAnswer, float] | None:
        """The cached answer of the nearest paraphrase at or above the threshold, with its similarity (None
        also when the reading has no text a paraphrase may match: `Reading.semantic_text`)."""
        if reading.semantic_text is None:
            return None
        namespace = semantic_namespace(scope, tier, reading)
        found = await self._index.nearest(namespace, await self._embed(reading.semantic_text, scope=scope))
        if found is None or found[1] < rule.threshold:
            return None
        answer = await self._responses.get(found[0])
        if answer is None:  # the exact entry expired: forget its vector too
            self._writes.spawn(self._index.remove(namespace, found[0]))
            return None
        return answer, found[1]

    def remember(self, scope: str, tier: str, reading: Reading, key: str, ttl_s: int) -> None:
        if reading.semantic_text is None:
            return
        namespace = semantic_namespace(scope, tier, reading)
        self._writes.spawn(self._add(scope, namespace, reading.semantic_text, key, ttl_s))

    async def _add(self, scope: str, namespace: str, text: str, key: str, ttl_s: int) -> None:
        await self._index.add(namespace, key, await self._embed(text, scope=scope), ttl_s)
