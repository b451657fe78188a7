"""Prefix affinity: which replica of a tier last served a prompt starting with the same text.

The prefix is cut into fixed blocks of `block_chars` characters (only complete blocks count) and
hashed as a chain, h_i = sha256(h_{i-1} + block_i)[:16], so a block's hash names the whole prefix
up to it (llm-d's scheme, over characters instead of tokens). The chain starts from the tenant's scope,
h_0 = sha256(scope)[:16] (gateway.keyspace: the tenant's name, or the shared scope when its policy shares
the cache), so one tenant's prompts never follow another's prefix to its replica. Each hash maps to a
replica under `pfx:{tier}:<hash>`; the braces make the tier a Redis Cluster hash tag, so one MGET covers a chain.
`lookup` is one MGET, `record` one pipeline of SET EX (no transaction); reuse is counted in
Prometheus (`gateway_prefix_lookups_total{tier,result=hit|miss|unavailable}`, `gateway_prefix_hit_blocks_total{tier}`),
never with an extra Redis round trip.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from gateway.cache.guard import RedisGuard

BLOCK_CHARS = 64
MAX_BLOCKS = 512  # 32k characters: longer prefixes are matched on their first MAX_BLOCKS blocks


def prefix_blocks(text: str, block_chars: int = BLOCK_CHARS, max_blocks: int = MAX_BLOCKS,
                  scope: str | None = None) -> list[str]:
    """The chained hashes (32 hex chars each) of the complete `block_chars` blocks of `text`, the chain started
    from `scope` (None: from nothing, the unscoped chain of llm-d's scheme)."""
    hashes: list[str] = []
    digest = b"" if scope is None else hashlib.sha256(scope.encode("utf-8", "surrogatepass")).digest()[:16]
    end = min(len(text) // block_chars, max_blocks) * block_chars
    for start in range(0, end, block_chars):
        digest = hashlib.sha256(digest + text[start:start + block_chars].encode()).digest()[:16]
        hashes.append(digest.hex())
    return hashes


def prefix_keys(scope: str, tier: str, text: str, block_chars: int = BLOCK_CHARS) -> list[str]:
    """The Redis keys of the prefix blocks of `text` on `tier`, in `scope` (a tenant's: gateway.keyspace)."""
    return [f"pfx:{{{tier}}}:{h}" for h in prefix_blocks(text, block_chars, scope=scope)]


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """The replica that holds the longest known prefix, and how long that prefix is."""

    replica: str
    blocks: int
    chars: int


class PrefixStore:
    """Prefix -> replica affinity in Redis, per tier (one store per guard: it registers metrics)."""

    def __init__(self, guard: RedisGuard, ttl_s: int = 600, block_chars: int = BLOCK_CHARS) -> None:
        self.guard = guard
        self.ttl_s = ttl_s
        self.block_chars = block_chars
        self._lookups = Counter("gateway_prefix_lookups", "Prefix affinity lookups", ("tier", "result"),
                                registry=guard.registry)
        self._hit_blocks = Counter("gateway_prefix_hit_blocks", "Prefix blocks found on a replica (reuse)",
                                   ("tier",), registry=guard.registry)

    async def lookup(self, tier: str, scope: str, prefix_text: str) -> PrefixMatch | None:
        """The replica of the longest prefix of `prefix_text` recorded in `scope`; None if none (or Redis is down)."""
        keys = prefix_keys(scope, tier, prefix_text, self.block_chars)
        if not keys:  # shorter than a block: a miss, without a round trip
            self._lookups.labels(tier, "miss").inc()
            return None
        client = self.guard.client
        values: list[Any] | None = await self.guard.run("prefix_lookup", lambda: client.mget(keys), key=keys)
        if values:
            for index in range(len(values) - 1, -1, -1):
                replica = values[index]
                if replica is not None:
                    self._lookups.labels(tier, "hit").inc()
                    self._hit_blocks.labels(tier).inc(index + 1)
                    name = replica.decode() if isinstance(replica, bytes) else str(replica)
                    return PrefixMatch(name, index + 1, (index + 1) * self.block_chars)
        self._lookups.labels(tier, "miss" if values is not None else "unavailable").inc()
        return None

    async def record(self, tier: str, scope: str, prefix_text: str, replica: str) -> None:
        """Remember that `replica` now holds `prefix_text` for `scope` (every block, refreshed to the TTL)."""
        keys = prefix_keys(scope, tier, prefix_text, self.block_chars)
        if keys:
            await self.guard.run("prefix_record", lambda: self._set_all(keys, replica), key=keys)

    async def _set_all(self, keys: list[str], value: str) -> list[Any]:
        async with self.guard.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.set(key, value, ex=self.ttl_s)
            result: list[Any] = await pipe.execute()
            return result
