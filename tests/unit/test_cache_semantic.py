"""Reply parsing of the semantic index and the embedding codec (no server needed)."""

from __future__ import annotations

import numpy as np
import pytest
import structlog
from redis.exceptions import ResponseError

from gateway.cache.embeddings import decode, encode
from gateway.cache.guard import RedisGuard
from gateway.cache.semantic import SemanticIndex, top_hit


def test_top_hit_reads_flat_and_mapped_replies_and_converts_the_score() -> None:
    assert top_hit([b"key-1", b"0.95"]) == ("key-1", pytest.approx(0.9))
    assert top_hit({b"key-2": 1.0}) == ("key-2", 1.0)
    assert top_hit({"key-3": 0.5}) == ("key-3", 0.0)
    assert top_hit([]) is None and top_hit({}) is None and top_hit(None) is None


def test_embedding_codec_is_compact_float16_and_checks_the_size() -> None:
    vector = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    vector /= np.linalg.norm(vector)
    raw = encode(vector)
    assert len(raw) == 768
    back = decode(raw, 384)
    assert back is not None and back.dtype == np.float32
    np.testing.assert_allclose(back, vector, atol=1e-3)
    assert decode(raw, 256) is None and decode(raw[:-1], 384) is None and decode("text", 384) is None


class OldRedis:
    """A client for a server without vector sets (and, optionally, with RediSearch)."""

    def __init__(self, search: bool) -> None:
        self.search = search
        self.commands: list[str] = []

    async def execute_command(self, *args: object) -> object:
        self.commands.append(str(args[0]))
        if args[0] == "FT._LIST" and self.search:
            return []
        raise ResponseError(f"unknown command '{args[0]}', with args beginning with: ")


@pytest.mark.parametrize(("search", "capability"), [(False, None), (True, "search")])
async def test_without_vector_sets_the_index_is_unavailable_and_calls_are_no_ops(
    search: bool, capability: str | None
) -> None:
    client = OldRedis(search)
    index = SemanticIndex(RedisGuard(client, op_timeout_s=0.1))  # type: ignore[arg-type]
    with structlog.testing.capture_logs() as logs:
        assert await index.detect() == capability
    assert not index.available and logs[0]["event"] == "semantic_index_unavailable"
    assert client.commands == ["VCARD", "FT._LIST"]
    await index.add("ns", "k", np.ones(384, np.float32), ttl_s=60)
    assert await index.nearest("ns", np.ones(384, np.float32)) is None
    assert client.commands == ["VCARD", "FT._LIST"]  # nothing more was sent
