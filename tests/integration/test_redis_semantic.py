"""The semantic index on a real Redis 8 vector set."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
import pytest
import structlog

from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.cache.semantic import SemanticIndex


@pytest.fixture
async def index(redis_url: str) -> AsyncIterator[SemanticIndex]:
    client = connect(redis_url)  # the session's Redis (tests/conftest.py), emptied for this test
    semantic = SemanticIndex(RedisGuard(client, op_timeout_s=0.5))
    assert await semantic.detect() == "vectorset" and semantic.available
    yield semantic
    await client.aclose()


def unit(seed: int) -> npt.NDArray[np.float32]:
    vector = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return vector / np.linalg.norm(vector)


async def test_nearest_finds_the_closest_key_with_its_cosine(index: SemanticIndex) -> None:
    for seed in range(20):
        await index.add("t1:small", f"resp:{seed}", unit(seed), ttl_s=60)
    query = unit(7) + 0.3 * unit(100)
    query /= np.linalg.norm(query)
    hit = await index.nearest("t1:small", query)
    assert hit is not None and hit[0] == "resp:7"
    assert hit[1] == pytest.approx(float(query @ unit(7)), abs=0.02)  # Q8 quantization
    exact = await index.nearest("t1:small", unit(3))
    assert exact is not None and exact[0] == "resp:3" and exact[1] > 0.99
    assert 55 <= await index.guard.client.ttl("sem:{t1:small}") <= 60


async def test_namespaces_are_isolated(index: SemanticIndex) -> None:
    await index.add("tenant-a", "resp:a", unit(1), ttl_s=60)
    await index.add("tenant-b", "resp:b", unit(2), ttl_s=60)
    hit = await index.nearest("tenant-b", unit(1))
    assert hit is not None and hit[0] == "resp:b" and hit[1] < 0.3
    assert await index.nearest("tenant-c", unit(1)) is None


async def test_remove_drops_a_stale_element(index: SemanticIndex) -> None:
    await index.add("ns", "old", unit(1), ttl_s=60)
    await index.add("ns", "other", unit(2), ttl_s=60)
    await index.remove("ns", "old")
    hit = await index.nearest("ns", unit(1))
    assert hit is not None and hit[0] == "other"


async def test_detect_when_redis_is_down_reports_none_and_calls_are_no_ops() -> None:
    client = connect("redis://127.0.0.1:1/0")
    semantic = SemanticIndex(RedisGuard(client))
    with structlog.testing.capture_logs() as logs:
        assert await semantic.detect() is None
    assert not semantic.available and logs[-1]["event"] == "semantic_index_unavailable"
    assert await semantic.nearest("ns", unit(1)) is None
    await semantic.add("ns", "k", unit(1), ttl_s=60)
    await client.aclose()
