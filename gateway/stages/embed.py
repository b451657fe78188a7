"""Embed: answer /v1/embeddings on an embedding tier, in the proxy's place (after admission).

In process (`embedder: {kind: minilm}`): each input goes through the CachedEmbedder (in-process
LRU, then the Redis embedding cache, then the micro-batched ONNX encoder, whose vectors are written
back to Redis). Usage is the encoder's WordPiece tokens of all the inputs.

Remote (`endpoint: embeddings` with replicas: vLLM `--task embed`, TEI, llama.cpp `--embedding`):
each distinct input is looked up in Redis by (served model, dimensions, text); only the inputs
missing go upstream, in one batch, to the ranked replicas in turn (`stages.failover`: another
replica on a connection error, timeout, 5xx or malformed answer); their vectors are written back
after the answer, and the response is assembled in input order. Usage is the backend's own count
of what it encoded now: inputs from the cache cost no tokens.

Either way, an input any gateway replica has embedded is not encoded again, and a request whose
inputs all came from a cache logs cache "hit" and, like a response cache hit, costs 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
import numpy as np
import numpy.typing as npt

from gateway.backends.embeddings import Embedded, embed
from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.backends.upstream import timeout_of
from gateway.cache.embeddings import Vectors
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.protocols.embeddings import float16_rounded, inputs_of, render
from gateway.stages.failover import answered, failover, lease, leased
from gateway.types import JsonReply, Reply

if TYPE_CHECKING:  # onnxruntime is imported only when an encoder is loaded
    from gateway.classifier.embedder import CachedEmbedder


class EmbedStage:
    def __init__(self, embedder: CachedEmbedder | None, count_tokens: Callable[[RequestContext], None],
                 remote: RemoteEmbeddings | None = None) -> None:
        self._embedder = embedder  # None: no tier embeds in process
        self._count_tokens = count_tokens
        self._remote = remote  # None: no remote embedding tiers can be served (no HTTP session)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        tier = ctx.tier
        if tier is None or tier.endpoint != "embeddings":
            return None
        texts = inputs_of(ctx.body)
        if tier.embedder is None and self._remote is not None:
            vectors = await self._remote.embed(ctx, texts)
        elif tier.embedder is not None and self._embedder is not None:
            ctx.upstream_started = True
            found, encoded = await self._embedder.embed_many(texts)
            ctx.cache = "miss" if encoded else "hit"  # a hit: every input came from the LRU or Redis (priced 0)
            vectors = float16_rounded(found)
        else:
            return None
        ctx.first_token_at = time.perf_counter()
        ctx.finish_reason = "stop"
        # in process, or a backend that reported no usage: the tier tokenizer's count of the inputs (all of them)
        self._count_tokens(ctx)
        body = render(vectors, ctx.body.get("encoding_format", "float"), tier.name, ctx.prompt_tokens or 0)
        return JsonReply(200, body)


class RemoteEmbeddings:
    """A remote embedding tier's vectors of a request's inputs: Redis first, then one batch upstream."""

    def __init__(self, session: aiohttp.ClientSession, pool: ReplicaPool, metrics: GatewayMetrics,
                 vectors: Vectors | None) -> None:
        self._session = session
        self._pool = pool
        self._metrics = metrics
        self._vectors = vectors  # None: no Redis, every input goes upstream (repeats within a request once)

    async def embed(self, ctx: RequestContext, texts: list[str]) -> npt.NDArray[np.float32]:
        """Each text's vector, in order; sets the request's cache status and usage."""
        assert ctx.tier is not None and ctx.tier.dimensions is not None
        tier, dimensions = ctx.tier, ctx.tier.dimensions
        model = "|".join(sorted({replica.model for replica in tier.replicas}))  # what the vectors depend on
        distinct = list(dict.fromkeys(texts))
        stored = await self._vectors.get_many(model, dimensions, distinct) if self._vectors else [None] * len(distinct)
        found = {text: vector for text, vector in zip(distinct, stored) if vector is not None}
        missing = [text for text in distinct if text not in found]
        ctx.cache = "miss" if missing else "hit"
        if missing:
            answer = await self._upstream(ctx, missing, dimensions)
            found.update(zip(missing, answer.vectors))
            if self._vectors is not None:
                self._vectors.put_later(model, dimensions, list(zip(missing, answer.vectors)))
            if answer.prompt_tokens is not None:
                ctx.prompt_tokens, ctx.completion_tokens, ctx.usage_source = answer.prompt_tokens, 0, "backend"
        else:
            ctx.prompt_tokens, ctx.completion_tokens, ctx.usage_source = 0, 0, "cache"
        return np.array([found[text] for text in texts], dtype=np.float32)

    async def _upstream(self, ctx: RequestContext, texts: list[str], dimensions: int) -> Embedded:
        timeout = timeout_of(ctx.config.routes.upstream)
        headers = ctx.trace.headers() if ctx.trace is not None else None
        tokens = estimate_tokens(sum(len(text) for text in texts))

        async def attempt(replica: Replica) -> Embedded:
            with leased(lease(ctx, self._pool, replica, tokens)) as held:
                answer = await embed(self._session, replica, texts, dimensions, timeout, headers)
            ctx.upstream_started = True
            answered(ctx, held)  # an embedding is a first token: its latency feeds TTFT and the limiter
            return answer

        return await failover(ctx, self._pool, self._metrics, attempt)
