"""The cache stage called directly, over a real Redis: bypass, miss and store, hit (JSON and SSE), and the
answers that must never be stored."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.backends.pool import ReplicaPool
from gateway.cache.background import BackgroundWrites
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.cache.responses import ResponseCache
from gateway.context import RequestContext
from gateway.stages.cache import CacheStage
from gateway.stages.policy import PolicyStage
from gateway.testing import gateway_config, parsed_context, routed as route, run_finishers, tier
from gateway.types import JsonReply, Reply, StreamReply

CONFIG = gateway_config([tier("t", ["http://127.0.0.1:9/v1"])])
REPLICA = CONFIG.tiers["t"].replicas[0]
DETERMINISTIC: dict[str, Any] = {"model": "t", "messages": [{"role": "user", "content": "What is a KV cache?"}],
                                 "temperature": 0}


@dataclass
class Cache:
    stage: CacheStage
    writes: BackgroundWrites
    guard: RedisGuard


@pytest.fixture
async def cache(redis_url: str) -> AsyncIterator[Cache]:
    guard = RedisGuard(connect(redis_url), op_timeout_s=0.5)  # the session's Redis, emptied for this test
    writes = BackgroundWrites()
    yield Cache(CacheStage(ResponseCache(guard, writes)), writes, guard)
    await writes.drain()
    await guard.client.aclose()


async def looked_up(stage: CacheStage, body: dict[str, Any]) -> tuple[RequestContext, Reply | None]:
    """A context through parse, policy and route, then the cache stage; its reply."""
    ctx = await parsed_context(CONFIG, body)
    await PolicyStage()(ctx)
    await route(ctx, ReplicaPool())
    return ctx, await stage(ctx)


def answered(ctx: RequestContext, **changes: Any) -> None:
    """What the proxy and accounting leave on the context after a complete answer, with `changes`."""
    ctx.upstream.replica, ctx.upstream.upstream_started, ctx.result.status, ctx.result.outcome = REPLICA, True, 200, "ok"
    ctx.upstream.response_text, ctx.upstream.finish_reason, ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens = "Hello!", "stop", 9, 3
    for name, value in changes.items():
        record = next((r for r in (ctx.upstream, ctx.result) if hasattr(r, name)), ctx)
        setattr(record, name, value)


async def stored(cache: Cache, ctx: RequestContext) -> None:
    """Run the finishers and wait for the background write."""
    run_finishers(ctx)
    await cache.writes.drain()


async def test_without_redis_the_cache_is_off() -> None:
    ctx, reply = await looked_up(CacheStage(None), DETERMINISTIC)
    assert reply is None and (ctx.cache, ctx.finishers) == ("off", [])


async def test_a_non_deterministic_request_bypasses_the_cache(cache: Cache) -> None:
    for body in ({**DETERMINISTIC, "temperature": 0.7}, {**DETERMINISTIC, "temperature": 0, "n": 2}):
        ctx, reply = await looked_up(cache.stage, body)
        assert reply is None and (ctx.cache, ctx.cache_key, ctx.finishers) == ("bypass", None, [])
    ctx, reply = await looked_up(cache.stage, {**DETERMINISTIC, "temperature": 0.7, "seed": 7})  # a seed: cached
    assert reply is None and ctx.cache == "miss"


async def test_a_miss_stores_the_complete_answer_and_the_repeat_is_a_hit(cache: Cache) -> None:
    ctx, reply = await looked_up(cache.stage, DETERMINISTIC)
    assert reply is None and ctx.cache == "miss" and ctx.cache_key is not None
    assert ctx.cache_key.startswith("resp:") and len(ctx.finishers) == 1
    answered(ctx)
    await stored(cache, ctx)
    assert await cache.guard.client.ttl(ctx.cache_key) == 3600  # the tenant's rule: an hour
    hit, reply = await looked_up(cache.stage, DETERMINISTIC)
    assert isinstance(reply, JsonReply) and reply.status == 200 and reply.headers == {"x-gateway-cache": "hit"}
    assert (hit.cache, hit.upstream.usage_source, hit.upstream.prompt_tokens, hit.upstream.completion_tokens) == ("hit", "cache", 9, 3)
    assert hit.finishers == []  # nothing to store again
    body = orjson.loads(reply.body)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello!"}
    assert (body["choices"][0]["finish_reason"], body["model"]) == ("stop", REPLICA.model)
    assert body["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


async def test_a_stored_answer_replays_as_a_stream_to_a_streaming_request(cache: Cache) -> None:
    ctx, _ = await looked_up(cache.stage, DETERMINISTIC)  # stored from a JSON answer ...
    answered(ctx)
    await stored(cache, ctx)
    streaming = {**DETERMINISTIC, "stream": True, "stream_options": {"include_usage": True}}
    hit, reply = await looked_up(cache.stage, streaming)  # ... served as SSE: `stream` is not part of the key
    assert isinstance(reply, StreamReply) and reply.headers == {"x-gateway-cache": "hit"} and hit.cache == "hit"
    raw = b"".join([piece async for piece in reply.source.chunks()])
    events = [orjson.loads(line.removeprefix(b"data: ")) for line in raw.split(b"\n\n")[:-2]]
    assert raw.endswith(b"data: [DONE]\n\n")
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == "Hello!"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["usage"] == {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}


@pytest.mark.parametrize("changes", [
    {"outcome": "client_disconnected", "status": 499},
    {"outcome": "upstream_error", "error": "upstream_stream_truncated"},
    {"error": "upstream_stream_truncated"},  # a malformed event, though the stream ended
    {"output_capped": True, "finish_reason": "length"},  # cut by the tenant's cap, not by the model
    {"finish_reason": None},
    {"finish_reason": "tool_calls"},
    {"response_text": None},
    {"completion_tokens": None},
    {"cache_key": None},  # moved to another tier by admission (brownout)
], ids=lambda changes: ",".join(f"{k}={v}" for k, v in changes.items()))
async def test_an_incomplete_answer_is_not_stored(cache: Cache, changes: dict[str, Any]) -> None:
    ctx, _ = await looked_up(cache.stage, DETERMINISTIC)
    key = ctx.cache_key
    assert key is not None
    answered(ctx, **changes)
    await stored(cache, ctx)
    assert await cache.guard.client.exists(key) == 0
    again, reply = await looked_up(cache.stage, DETERMINISTIC)
    assert reply is None and again.cache == "miss"
