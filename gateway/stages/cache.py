"""Cache: answer a repeated deterministic request from Redis, or arrange for its answer to be stored.

Only a complete, successful answer is stored (outcome ok, finish stop or length, no malformed
events); errors, cancelled and broken streams never are. A hit costs nothing and logs the avoided cost.
"""

from __future__ import annotations


from gateway.cache.answers import CachedAnswer, Replay, json_body, sse_body
from gateway.cache.keys import cacheable, response_key, scope_of
from gateway.cache.responses import ResponseCache
from gateway.cache.semantic_cache import SemanticCache
from gateway.context import RequestContext
from gateway.types import CacheStatus, JsonReply, Reply, StreamReply

HIT_HEADERS = {"x-gateway-cache": "hit"}
SEMANTIC_HIT_HEADERS = {"x-gateway-cache": "semantic-hit"}
STORABLE_FINISH = frozenset({"stop", "length"})


class CacheStage:
    def __init__(self, responses: ResponseCache | None, semantic: SemanticCache | None = None) -> None:
        self._responses = responses
        self._semantic = semantic

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        reading = ctx.reading
        if self._responses is None or ctx.route.tier is None or ctx.tenant is None or reading is None:
            return None
        rule = ctx.tenant.cache
        if not cacheable(reading, rule):
            ctx.cache = "bypass"
            return None
        scope = scope_of(ctx.tenant_name, rule)
        key = response_key(scope, ctx.route.tier.name, reading)
        answer = await self._responses.get(key)
        if answer is not None:
            return _replay(ctx, answer, "hit")
        semantic = self._semantic if rule.semantic is not None and reading.semantic_text is not None else None
        if semantic is not None and rule.semantic is not None:
            found = await semantic.lookup(scope, ctx.route.tier.name, reading, rule.semantic)
            if found is not None:
                return _replay(ctx, found[0], "semantic_hit")
        ctx.cache, ctx.cache_key = "miss", key
        ctx.finishers.append(lambda done: self._store(done, rule.ttl_s, scope if semantic is not None else None))
        return None

    def _store(self, ctx: RequestContext, ttl_s: int, semantic_scope: str | None) -> None:
        answer = _storable_answer(ctx)
        if answer is None or ctx.cache_key is None or self._responses is None:
            return
        self._responses.put_later(ctx.cache_key, answer, ttl_s)
        if semantic_scope is not None and self._semantic is not None and ctx.route.tier is not None \
                and ctx.reading is not None:
            self._semantic.remember(semantic_scope, ctx.route.tier.name, ctx.reading, ctx.cache_key, ttl_s)


def _storable_answer(ctx: RequestContext) -> CachedAnswer | None:
    """The answer to store: only a complete, successful, uncapped one with known token counts."""
    complete = ctx.result.outcome == "ok" and ctx.result.status == 200 and ctx.result.error is None and not ctx.upstream.output_capped
    if not complete or ctx.upstream.finish_reason not in STORABLE_FINISH or ctx.upstream.response_text is None:
        return None
    if ctx.upstream.prompt_tokens is None or ctx.upstream.completion_tokens is None:
        return None
    model = ctx.upstream.replica.model if ctx.upstream.replica else ""
    return CachedAnswer(ctx.upstream.response_text, ctx.upstream.finish_reason or "stop", ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens,
                        model, ctx.upstream.stop_sequence)


def _replay(ctx: RequestContext, answer: CachedAnswer, status: CacheStatus) -> Reply:
    ctx.cache = status
    headers = HIT_HEADERS if status == "hit" else SEMANTIC_HIT_HEADERS
    ctx.upstream.replayed(answer.prompt_tokens, answer.completion_tokens, answer.finish_reason)
    if ctx.stream:
        body = sse_body(ctx.endpoint, answer, ctx.request_id, ctx.client_wants_usage)
        return StreamReply(Replay(body), headers)
    return JsonReply(200, json_body(ctx.endpoint, answer, ctx.request_id), headers)
