"""Embed: answer /v1/embeddings on a tier served in process (the MiniLM sentence encoder).

After admission, in the proxy's place for such tiers: each input goes through the CachedEmbedder
(in-process LRU, then the Redis embedding cache, then the micro-batched ONNX encoder, whose
vectors are written back to Redis), so an input any gateway replica has seen is not encoded again.
A request whose inputs all came from a cache logs cache "hit" and, like a response cache hit, costs 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.context import RequestContext
from gateway.protocols.embeddings import inputs_of, render
from gateway.types import JsonReply, Reply

if TYPE_CHECKING:  # onnxruntime is imported only when an encoder is loaded
    from gateway.classifier.embedder import CachedEmbedder


class EmbedStage:
    def __init__(self, embedder: CachedEmbedder | None, count_tokens: Callable[[RequestContext], None]) -> None:
        self._embedder = embedder  # None: no tier embeds in process
        self._count_tokens = count_tokens

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        embedder = self._embedder
        if ctx.tier is None or ctx.tier.embedder is None or embedder is None:
            return None
        ctx.upstream_started = True
        vectors, encoded = await embedder.embed_many(inputs_of(ctx.body))
        ctx.cache = "miss" if encoded else "hit"  # a hit: every input came from the LRU or Redis (priced 0)
        ctx.first_token_at = time.perf_counter()
        ctx.finish_reason = "stop"
        self._count_tokens(ctx)  # the encoder's WordPiece tokens of the inputs: what the client is told
        body = render(vectors, ctx.body.get("encoding_format", "float"), ctx.tier.name, ctx.prompt_tokens or 0)
        return JsonReply(200, body)
