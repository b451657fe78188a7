"""Embed: answer /v1/embeddings on an embedding tier, in the proxy's place (after admission).

In process (`embedder: {kind: minilm}`): each input goes through the CachedEmbedder (in-process
LRU, then the Redis embedding cache, then the micro-batched ONNX encoder, whose vectors are written
back to Redis). Usage is the encoder's WordPiece tokens of all the inputs.

Remote (`endpoint: embeddings` with replicas: vLLM `--task embed`, TEI, llama.cpp `--embedding`): the
upstream hop's `RemoteEmbeddings` (gateway.upstream.embeddings): Redis, single flight, then the replicas with
failover. Usage is the backend's own count of what this request sent.

Either way, an input any gateway replica has embedded for the same tenant scope is not encoded again,
and a request whose inputs all came from a cache (or another request's call) logs cache "hit" and, like a
response cache hit, costs 0. Every cache and in-flight call is keyed by the tenant's scope (gateway.keyspace):
another tenant's identical input is a miss, sent and priced, unless both policies share the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.protocols.embeddings import float16_rounded, inputs_of, render
from gateway.types import JsonReply, Reply
from gateway.upstream.embeddings import RemoteEmbeddings, inputs_scope

if TYPE_CHECKING:  # onnxruntime is imported only when an encoder is loaded
    from gateway.classifier.embedder import CachedEmbedder


class EmbedStage:
    def __init__(self, embedder: CachedEmbedder | None, count_tokens: Callable[[RequestContext], None],
                 remote: RemoteEmbeddings | None = None) -> None:
        self._embedder = embedder  # None: no tier embeds in process
        self._count_tokens = count_tokens
        self._remote = remote  # None: no remote embedding tiers can be served (no HTTP session)

    def idle(self, config: GatewayConfig) -> bool:
        """`config` has no embedding tier: the stage does nothing."""
        return not any(t.endpoint == "embeddings" for t in config.routes.tiers)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        tier = ctx.route.tier
        if tier is None or tier.endpoint != "embeddings":
            return None
        texts = inputs_of(ctx.body)
        if tier.embedder is None and self._remote is not None:
            vectors = await self._remote.embed(ctx, texts)
        elif tier.embedder is not None and self._embedder is not None:
            ctx.upstream.began()
            found, encoded = await self._embedder.embed_many(texts, scope=inputs_scope(ctx))
            ctx.cache = "miss" if encoded else "hit"  # a hit: every input came from the LRU or Redis (priced 0)
            vectors = float16_rounded(found)
        else:
            return None
        ctx.upstream.finished("stop", time.perf_counter())
        # in process, or a backend that reported no usage: the tier tokenizer's count of the inputs (all of them)
        self._count_tokens(ctx)
        body = render(vectors, ctx.body.get("encoding_format", "float"), tier.name, ctx.upstream.prompt_tokens or 0)
        return JsonReply(200, body)


