"""Issue 37: request ids are 128 random bits (not a process prefix and a counter that can be guessed and that
count traffic), and a lookup by id does the same work whether the id is unknown or another tenant's."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
from redis.asyncio import Redis

from gateway.app import create_app
from gateway.cache.guard import Keys, RedisGuard
from gateway.experiments.feedback import RequestOwner, RequestOwners, submit_feedback
from gateway.errors import NotFound
from gateway.edge.request_ids import next_request_id
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

T = TypeVar("T")
ID = re.compile(r"^[0-9a-f]{32}$")


def test_ids_are_128_random_bits() -> None:
    ids = [next_request_id() for _ in range(2000)]  # more than one batch read from the OS
    assert all(ID.match(i) for i in ids) and len(set(ids)) == len(ids)
    for position in range(32):  # every hex digit varies: no fixed prefix, no counter in the tail
        assert len({i[position] for i in ids}) == 16, position
    first = [int(i, 16) for i in ids[:100]]
    assert sorted(first) != first  # not increasing
    child = subprocess.run([sys.executable, "-c", "from gateway.edge.request_ids import next_request_id as n; print(n())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert ID.match(child) and child not in ids


async def test_the_gateway_answers_with_random_ids(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await start_app(create_app(gateway_config([tier("t", [f"{(await start_emulator()).url}/v1"])])))
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as session:
        seen = []
        for _ in range(3):
            async with session.post(f"{url}/v1/chat/completions", json=body) as response:
                assert response.status == 200
                seen.append(response.headers["x-request-id"])
    assert all(ID.match(i) for i in seen) and len({i[:24] for i in seen}) == 3  # no shared process prefix


class CountingGuard(RedisGuard):
    """A RedisGuard that counts the operations it runs, by name."""

    def __init__(self, client: Any) -> None:
        super().__init__(client, op_timeout_s=1.0)
        self.ops: Counter[str] = Counter()

    async def run(self, op: str, call: Callable[[], Awaitable[T]], timeout_s: float | None = None, *,
                  key: Keys = None) -> T | None:
        self.ops[op] += 1
        return await super().run(op, call, timeout_s, key=key)


@pytest.fixture
async def guard(redis_url: str) -> AsyncIterator[CountingGuard]:
    client = Redis.from_url(redis_url)
    yield CountingGuard(client)
    await client.aclose()


async def test_a_lookup_reads_redis_for_an_id_this_process_served_as_for_an_unknown_one(
        guard: CountingGuard) -> None:
    owners = RequestOwners(guard, batch_every_s=3600)  # bob's id stays in this process only
    bobs = next_request_id()
    owners.record(bobs, RequestOwner("bob"))
    for request_id in (bobs, next_request_id()):  # another tenant's id, then an unknown one
        before = guard.ops["feedback_owner_get"]
        with pytest.raises(NotFound) as refused:
            await submit_feedback({"request_id": request_id, "score": 1}, "alice", owners)
        assert guard.ops["feedback_owner_get"] == before + 1  # one Redis round trip each: the same work
        assert refused.value.code == "request_not_found"
    assert await owners.lookup(bobs) == RequestOwner("bob")  # the owner still found (here, from this process)
