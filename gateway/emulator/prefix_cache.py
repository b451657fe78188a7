"""LRU prefix cache over chained block hashes, counted in tokens like vLLM's metrics."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Holds up to `capacity_tokens // block_size` prompt blocks, least recently used out first."""

    __slots__ = ("block_size", "capacity_blocks", "queries", "hits", "_blocks")

    def __init__(self, capacity_tokens: int, block_size: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens // block_size)
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # prompt tokens found cached
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Cached prompt tokens (leading full blocks, at most prompt_tokens - 1); counts the query.

        The last prompt token is always recomputed, as in vLLM, so a full hit still
        costs one token of prefill.
        """
        blocks = self._blocks
        n = 0
        for h in hashes:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            n += 1
        hit = min(n * self.block_size, max(prompt_tokens - 1, 0))
        self.queries += prompt_tokens
        self.hits += hit
        return hit

    def insert(self, hashes: Sequence[int]) -> None:
        """Store the blocks of a prefilled prompt, evicting the least recently used."""
        if self.capacity_blocks == 0:
            return
        blocks = self._blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
