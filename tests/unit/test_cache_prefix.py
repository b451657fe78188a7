"""prefix_blocks: a hash chain over complete fixed-size blocks."""

from __future__ import annotations

import hashlib

from gateway.cache.prefix import prefix_blocks


def test_only_complete_blocks_count() -> None:
    assert prefix_blocks("x" * 63) == []
    assert len(prefix_blocks("x" * 64)) == 1
    assert len(prefix_blocks("x" * 200)) == 3
    assert len(prefix_blocks("x" * 200, block_chars=10)) == 20


def test_chain_is_sha256_of_previous_digest_plus_block() -> None:
    text = "a" * 64 + "b" * 64
    first = hashlib.sha256(b"a" * 64).digest()[:16]
    second = hashlib.sha256(first + b"b" * 64).digest()[:16]
    assert prefix_blocks(text) == [first.hex(), second.hex()]


def test_a_shared_prefix_shares_hashes_until_the_first_difference() -> None:
    base = "You are a helpful assistant. " * 10  # 290 chars: 4 blocks
    one, other = prefix_blocks(base + "A" * 64), prefix_blocks(base + "B" * 64)
    assert one[:4] == other[:4] and one[4] != other[4]
    changed_early = prefix_blocks("Z" + base[1:] + "A" * 64)
    assert not set(changed_early) & set(one)  # a change in block 0 changes every later hash


def test_identical_blocks_at_different_positions_hash_differently() -> None:
    hashes = prefix_blocks("same block " * 64)
    assert len(set(hashes)) == len(hashes)


def test_non_ascii_text_is_hashed_by_characters() -> None:
    assert len(prefix_blocks("é" * 128)) == 2
    assert len(prefix_blocks("x" * 64 * 1000, max_blocks=512)) == 512
