"""An embedding tier's replicas: the upstream hop of /v1/embeddings (the embed stage calls it).

Remote tiers (`endpoint: embeddings` with replicas: vLLM `--task embed`, TEI, llama.cpp `--embedding`):
each distinct input is looked up in Redis by (served model, dimensions, text); a missing input
another request of this process is already embedding is awaited from that call (single flight, by
the same key); only the others go upstream, in one batch, to the ranked replicas in turn
(`gateway.upstream.attempt`: another replica on a connection error, timeout, 5xx or malformed answer). That
call is a task of its own: the requests waiting for it get its vectors even if the one that sent it
leaves; if it fails, each waiter sends the inputs it waited for itself, once, with its own failover
(an error is then its own). Vectors are written back after the answer, and the response is assembled
in input order. Usage is the backend's own count of what this request sent: inputs from the cache
or another request's call cost no tokens.

Every cache and in-flight call is keyed by the tenant's scope (gateway.keyspace, `inputs_scope`): another
tenant's identical input is a miss, sent and priced, unless both policies share the cache.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from gateway.backends.embeddings import Embedded, embed
from gateway.backends.h1 import UpstreamClient
from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import estimate_tokens
from gateway.cache.embeddings import Vector, Vectors, vector_key
from gateway.cache.singleflight import SingleFlight
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.keyspace import tenant_scope
from gateway.metrics import GatewayMetrics
from gateway.upstream.attempt import Attempt, failover


class RemoteEmbeddings:
    """A remote embedding tier's vectors of a request's inputs: Redis first, then the inputs another request
    of this process is embedding (single flight), then one batch upstream of the rest."""

    def __init__(self, client: UpstreamClient, pool: ReplicaPool, metrics: GatewayMetrics,
                 vectors: Vectors | None) -> None:
        self._client = client
        self._pool = pool
        self._metrics = metrics
        self._vectors = vectors  # None: no Redis, every input goes upstream (once while it is in flight here)
        self._flights: SingleFlight[str, Vector] = SingleFlight()  # by `vector_key`: the inputs being embedded

    async def embed(self, ctx: RequestContext, texts: list[str]) -> npt.NDArray[np.float32]:
        """Each text's vector, in order; sets the request's cache status and usage."""
        assert ctx.route.tier is not None and ctx.route.tier.dimensions is not None
        tier, dimensions = ctx.route.tier, ctx.route.tier.dimensions
        model = "|".join(sorted({replica.model for replica in tier.replicas}))  # what the vectors depend on
        scope, distinct = inputs_scope(ctx), list(dict.fromkeys(texts))
        stored = (await self._vectors.get_many(scope, model, dimensions, distinct) if self._vectors
                  else [None] * len(distinct))
        found = {text: vector for text, vector in zip(distinct, stored) if vector is not None}
        missing = {vector_key(scope, model, dimensions, text): text for text in distinct if text not in found}
        answers: list[Embedded] = []  # this request's own upstream answers: its usage, also if a later one fails
        try:
            await self._embed_missing(ctx, model, dimensions, missing, found, answers)
        finally:
            counted = [answer.prompt_tokens for answer in answers if answer.prompt_tokens is not None]
            if answers and len(counted) == len(answers):  # else the tier tokenizer counts all the inputs
                ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.usage_source = sum(counted), 0, "backend"
        if not answers:
            ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.usage_source = 0, 0, "cache"
        return np.array([found[text] for text in texts], dtype=np.float32)

    async def _embed_missing(self, ctx: RequestContext, model: str, dimensions: int, missing: dict[str, str],
                             found: dict[str, Vector], answers: list[Embedded]) -> None:
        """Add the vectors of the `missing` texts (by key) to `found`: those another request is embedding from
        its call, the others from this request's own (appended to `answers`); sets the cache status."""
        flight = self._flights.join(
            list(missing), lambda led: self._fetch(ctx, model, dimensions, [missing[key] for key in led]),
            lambda answer: answer.vectors)
        ctx.cache = "miss" if flight.fetch is not None else "hit"  # inputs another request embeds are like hits
        if flight.fetch is not None:  # a task of its own: those who wait for it do even if this request leaves
            answers.append(await asyncio.shield(flight.fetch))
            found.update(zip((missing[key] for key in flight.led), answers[-1].vectors))
        orphans = []  # inputs whose leading request's call failed: sent again by this request, as if alone
        for key, joined in flight.joined.items():
            if (vector := await asyncio.shield(joined)) is None:
                orphans.append(missing[key])
            else:
                found[missing[key]] = vector
        if orphans:
            ctx.cache = "miss"
            answers.append(await self._fetch(ctx, model, dimensions, orphans))
            found.update(zip(orphans, answers[-1].vectors))

    async def _fetch(self, ctx: RequestContext, model: str, dimensions: int, texts: list[str]) -> Embedded:
        """The vectors of `texts` from upstream, written back to Redis (also when the request has left)."""
        answer = await self._upstream(ctx, texts, dimensions)
        if self._vectors is not None:
            self._vectors.put_later(inputs_scope(ctx), model, dimensions, list(zip(texts, answer.vectors)))
        return answer

    async def _upstream(self, ctx: RequestContext, texts: list[str], dimensions: int) -> Embedded:
        settings = ctx.config.routes.upstream
        headers = ctx.trace.headers() if ctx.trace is not None else None
        tokens = estimate_tokens(sum(len(text) for text in texts))

        async def one(replica: Replica) -> Embedded:
            with Attempt(ctx, self._pool, replica, tokens=tokens) as attempt:
                answer = await embed(self._client, replica, texts, dimensions, settings, headers)
            ctx.upstream.upstream_started = True
            attempt.answered(decode_s=0.0)  # an embedding is a first token: its latency feeds TTFT and the limiter
            return answer

        return await failover(ctx, self._pool, self._metrics, one)


def inputs_scope(ctx: RequestContext) -> str:
    """The tenant scope every cache of this request's inputs is keyed by."""
    return tenant_scope(ctx.tenant) if ctx.tenant is not None else ctx.tenant_name
