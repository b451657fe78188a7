"""The semantic cache (opt-in per policy): a paraphrase of a cached prompt gets the cached answer.

The prompt's embedding (the classifier's encoder, cached in Redis) is looked up in a Redis vector
set per namespace (tenant scope, tier, output-changing parameters); a hit needs cosine similarity >=
the policy's threshold and the exact entry it points to still alive. Measured precision is modest
(docs/BENCHMARKS.md): near-misses such as swapped units score as high as paraphrases.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from gateway.cache.answers import CachedAnswer
from gateway.cache.background import BackgroundWrites
from gateway.cache.keys import semantic_namespace
from gateway.cache.responses import ResponseCache
from gateway.cache.semantic import SemanticIndex
from gateway.config.policies import SemanticRule

Embed = Callable[[str], Awaitable[np.ndarray[Any, Any]]]


class SemanticCache:
    def __init__(self, index: SemanticIndex, embed: Embed, responses: ResponseCache, writes: BackgroundWrites) -> None:
        self._index = index
        self._embed = embed
        self._responses = responses
        self._writes = writes

    async def lookup(self, scope: str, tier: str, endpoint: str, body: dict[str, Any], text: str,
                     rule: SemanticRule) -> tuple[CachedAnswer, float] | None:
        """The cached answer of the nearest paraphrase at or above the threshold, with its similarity."""
        namespace = semantic_namespace(scope, tier, endpoint, body)
        found = await self._index.nearest(namespace, await self._embed(text))
        if found is None or found[1] < rule.threshold:
            return None
        answer = await self._responses.get(found[0])
        if answer is None:  # the exact entry expired: forget its vector too
            self._writes.spawn(self._index.remove(namespace, found[0]))
            return None
        return answer, found[1]

    def remember(self, scope: str, tier: str, endpoint: str, body: dict[str, Any], text: str, key: str,
                 ttl_s: int) -> None:
        namespace = semantic_namespace(scope, tier, endpoint, body)
        self._writes.spawn(self._add(namespace, text, key, ttl_s))

    async def _add(self, namespace: str, text: str, key: str, ttl_s: int) -> None:
        await self._index.add(namespace, key, await self._embed(text), ttl_s)
