"""Request ids: one per request that reached the gateway, in its log line and its x-request-id header.

Each id is 128 random bits from the OS's CSPRNG (32 hex characters): it can neither be guessed (feedback and
every lookup by id take an id only as proof of nothing: the owner is checked) nor counted (a process prefix and
a counter told how much traffic a gateway served between two of a tenant's requests). The bytes are read 256
ids at a time, so a request costs a slice of a buffer, not a syscall; a forked child starts a buffer of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

ID_BYTES = 16  # 128 bits
BATCH = 256  # ids read from the OS at once


def _random_ids() -> Iterator[str]:
    width = 2 * ID_BYTES
    while True:
        block = os.urandom(ID_BYTES * BATCH).hex()
        for start in range(0, len(block), width):
            yield block[start:start + width]


_ids = _random_ids()


def _after_fork() -> None:
    global _ids  # noqa: PLW0603 - the buffer a forked child must not share with its parent
    _ids = _random_ids()


os.register_at_fork(after_in_child=_after_fork)


def next_request_id() -> str:
    """A new request id: 32 hex characters, 128 random bits (event loop only: not thread-safe)."""
    return next(_ids)
