"""Shadow pairs are kept per tenant (real Redis): one tenant's pairs are never listed with another's, and one
tenant's traffic trimming its stream to `max_pairs` never evicts another tenant's pairs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from gateway.cache.guard import RedisGuard
from gateway.experiments.shadow import AgreementScorer, PairStore, ShadowJob, ShadowSender
from tests.unit.test_experiments_shadow import BODY, RULE, Recorder, WordEmbedder


class Words(WordEmbedder):
    """The bag-of-words embedder, taking whatever else the scorer passes (a cache scope)."""

    async def embed_many(self, texts: Sequence[str], **_: Any) -> Any:  # type: ignore[override]
        return await super().embed_many(texts)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[PairStore]:
    client = Redis.from_url(redis_url)
    yield PairStore(RedisGuard(client, op_timeout_s=1.0))
    await client.aclose()


def sender(store: PairStore) -> ShadowSender:
    return ShadowSender(Recorder({"large-fp16": "Paris is the capital city of France."}),
                        AgreementScorer(Words()), store, lambda: False)


async def test_each_tenant_lists_only_its_own_pairs(store: PairStore) -> None:
    """Pins: pairs go to a stream per tenant (one shared stream would show alice bob's prompts and answers)."""
    shadow = sender(store)
    for i in range(3):
        for tenant in ("alice", "bob"):
            assert await shadow.run(ShadowJob(f"{tenant}-{i}", tenant, RULE, BODY, "Paris.", "small-int4")) is not None
    alice, bob = await store.recent("alice"), await store.recent("bob")
    assert [p["request_id"] for p in alice] == ["alice-2", "alice-1", "alice-0"]
    assert [p["request_id"] for p in bob] == ["bob-2", "bob-1", "bob-0"]
    assert {p["tenant"] for p in alice} == {"alice"} and {p["tenant"] for p in bob} == {"bob"}
    assert await store.recent("carol") == []


async def test_one_tenants_max_pairs_does_not_evict_anothers(store: PairStore) -> None:
    """Pins: the MAXLEN trim is per tenant: alice's 12 pairs keep her newest 5 (RULE.max_pairs) and leave
    bob's 2 in place."""
    shadow = sender(store)
    for i in range(2):
        await shadow.run(ShadowJob(f"bob-{i}", "bob", RULE, BODY, "Paris.", "small-int4"))
    await asyncio.gather(*(shadow.run(ShadowJob(f"alice-{i}", "alice", RULE, BODY, "Lyon.", "small-int4"))
                           for i in range(12)))
    assert len(await store.recent("alice")) == RULE.max_pairs == 5
    assert [p["request_id"] for p in await store.recent("bob")] == ["bob-1", "bob-0"]
