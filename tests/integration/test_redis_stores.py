"""Prefix affinity and embedding stores on a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from gateway.cache.connection import connect
from gateway.cache.embeddings import EmbeddingStore
from gateway.cache.guard import RedisGuard
from gateway.cache.prefix import PrefixMatch, PrefixStore
from gateway.local.redis_server import free_port

SYSTEM = "You are a careful assistant who answers in short sentences. " * 3  # 180 chars: 2 blocks


@pytest.fixture
async def guard(redis_url: str) -> AsyncIterator[RedisGuard]:
    client = connect(redis_url)  # the session's Redis (tests/conftest.py), emptied for this test
    yield RedisGuard(client, op_timeout_s=0.5)
    await client.aclose()


async def test_prefix_lookup_returns_the_replica_of_the_longest_match(guard: RedisGuard) -> None:
    store = PrefixStore(guard)
    history = "user: how do I sort a list in python? assistant: use sorted() or list.sort(). " * 2
    await store.record("small", "alice", SYSTEM + history, "replica-b")
    await store.record("small", "alice", SYSTEM, "replica-a")  # the latest server of a block owns it
    assert await store.lookup("small", "alice", SYSTEM + "user: something else entirely, a new conversation " * 2) == (
        PrefixMatch("replica-a", 2, 128))
    longest = await store.lookup("small", "alice", SYSTEM + history + "user: and in reverse?")
    assert longest == PrefixMatch("replica-b", 5, 320)
    assert await store.lookup("small", "alice", "Completely different system prompt. " * 5) is None
    assert await store.lookup("small", "alice", "short") is None  # no complete block: no round trip either
    assert guard.registry.get_sample_value("gateway_prefix_hit_blocks_total", {"tier": "small"}) == 7
    assert guard.registry.get_sample_value("gateway_prefix_lookups_total", {"tier": "small", "result": "miss"}) == 2


async def test_prefixes_are_isolated_between_tiers(guard: RedisGuard) -> None:
    store = PrefixStore(guard)
    await store.record("small", "alice", SYSTEM, "small-0")
    await store.record("large", "alice", SYSTEM, "large-1")
    assert (await store.lookup("small", "alice", SYSTEM)) == PrefixMatch("small-0", 2, 128)
    assert (await store.lookup("large", "alice", SYSTEM)) == PrefixMatch("large-1", 2, 128)
    assert await store.lookup("medium", "alice", SYSTEM) is None


async def test_prefixes_expire_after_their_ttl(guard: RedisGuard) -> None:
    store = PrefixStore(guard, ttl_s=1)
    await store.record("small", "alice", SYSTEM, "replica-a")
    assert await store.lookup("small", "alice", SYSTEM) is not None
    ttls = [await guard.client.ttl(key) for key in await guard.client.keys("pfx:*")]
    assert ttls == [1, 1]
    await asyncio.sleep(1.1)
    assert await store.lookup("small", "alice", SYSTEM) is None


async def test_embeddings_round_trip_as_float16(guard: RedisGuard) -> None:
    store = EmbeddingStore(guard, ttl_s=60)
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((3, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    await store.put_many([("h1", vectors[0]), ("h2", vectors[1]), ("h3", vectors[2])])
    got = await store.get_many(["h2", "missing", "h1", "h3"])
    assert got[1] is None
    for found, expected in zip([got[0], got[2], got[3]], [vectors[1], vectors[0], vectors[2]], strict=True):
        assert found is not None and found.shape == (384,) and found.dtype == np.float32
        np.testing.assert_allclose(found, expected, atol=1e-3)
    assert await guard.client.strlen("emb:h1") == 768 and await guard.client.ttl("emb:h1") == 60
    await guard.client.set("emb:bad", b"not a vector")
    assert await store.get_many(["bad"]) == [None]
    assert await store.get_many([]) == []


async def test_stores_answer_none_when_redis_is_down() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    guard = RedisGuard(client)
    embeddings, prefixes = EmbeddingStore(guard), PrefixStore(guard)
    assert await embeddings.get_many(["a", "b"]) == [None, None]
    await embeddings.put_many([("a", np.zeros(384, np.float32))])
    assert await prefixes.lookup("small", "alice", SYSTEM) is None
    await prefixes.record("small", "alice", SYSTEM, "x")
    assert not guard.up
    await client.aclose()
