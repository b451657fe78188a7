"""Issue 37: the emulator keys its prefix cache by vLLM's `cache_salt` and refuses a salt vLLM refuses."""

from __future__ import annotations

import pytest

from gateway.emulator.parse import BadRequest, parse_body
from gateway.emulator.tokens import block_hashes

TOKENS = [f"t{i}" for i in range(64)]


def test_the_salt_keys_every_block() -> None:
    plain, alice, bob = block_hashes(TOKENS, 16), block_hashes(TOKENS, 16, "a"), block_hashes(TOKENS, 16, "b")
    assert len(plain) == len(alice) == 4 and block_hashes(TOKENS, 16, "a") == alice
    assert not set(plain) & set(alice) and not set(alice) & set(bob)


@pytest.mark.parametrize("salt", ["", 7, ["a"]])
def test_a_salt_that_is_not_a_non_empty_string_is_refused(salt: object) -> None:
    with pytest.raises(BadRequest, match="cache_salt"):
        parse_body(b'{"model": "m", "prompt": "hi", "cache_salt": %s}' % repr(salt).replace("'", '"').encode(),
                   "completion")
    assert parse_body(b'{"model": "m", "prompt": "hi", "cache_salt": "s"}', "completion").cache_salt == "s"
