"""POST /v1/feedback's core: validation, the tenant check through the request-owner map (real Redis, shared by
two gateway replicas), storage and the log line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import structlog
from redis.asyncio import Redis

from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.errors import GatewayError, InvalidRequest, NotFound, Overloaded, RateLimited, error_body
from gateway.experiments.feedback import (
    DEFAULT_PER_MIN, OWNER_BUCKET_S, OWNER_PREFIX, FeedbackLimiter, FeedbackStore, RequestOwner, RequestOwners,
    feedback_per_minute, owner_bucket_key, parse_feedback, submit_feedback,
)

ALICE = RequestOwner("alice", "bands-v2", "treatment", "large-fp16")

DEAD_REDIS = "redis://127.0.0.1:1"  # nothing listens: the gateway's own client, refused at once (no retry backoff)


@pytest.fixture
async def guard(redis_url: str) -> AsyncIterator[RedisGuard]:
    client = Redis.from_url(redis_url)
    yield RedisGuard(client, op_timeout_s=1.0)
    await client.aclose()


@pytest.mark.parametrize(("body", "param", "message"), [
    (b"{", None, "not valid JSON"),
    (b"[1]", None, "must be a JSON object"),
    ({"score": 1}, "request_id", "'request_id' must be"),
    ({"request_id": "a b", "score": 1}, "request_id", "'request_id' must be"),
    ({"request_id": "r1"}, "score", "give one of 'score'"),
    ({"request_id": "r1", "score": 1, "thumbs": "up"}, "score", "give one of 'score'"),
    ({"request_id": "r1", "score": 1.5}, "score", "in [0, 1], got 1.5"),
    ({"request_id": "r1", "score": True}, "score", "in [0, 1], got True"),
    ({"request_id": "r1", "score": "0.5"}, "score", "in [0, 1]"),
    ({"request_id": "r1", "thumbs": "sideways"}, "thumbs", "'up' or 'down'"),
    ({"request_id": "r1", "score": 0, "comment": "x" * 2001}, "comment", "at most 2000"),
    ({"request_id": "r1", "score": 0, "rating": 5}, "rating", "unknown field 'rating'"),
])
def test_bad_bodies_are_refused_naming_the_field(body: Any, param: str | None, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_feedback(body)
    assert caught.value.param == param and message in caught.value.message
    assert orjson.loads(error_body(caught.value))["error"]["type"] == "invalid_request_error"


def test_scores_and_thumbs_are_read() -> None:
    assert parse_feedback(b'{"request_id": "abc123", "score": 0.25}') == ("abc123", 0.25, "score", None)
    assert parse_feedback({"request_id": "abc", "thumbs": "up", "comment": "ok"}) == ("abc", 1.0, "thumbs", "ok")
    assert parse_feedback({"request_id": "abc", "thumbs": "down"})[1] == 0.0
    assert parse_feedback({"request_id": "abc", "score": 1})[1] == 1.0


async def test_feedback_recorded_on_one_replica_is_accepted_on_another_and_refused_for_another_tenant(
    guard: RedisGuard,
) -> None:
    replica_a, replica_b = RequestOwners(guard, batch_every_s=0.01), RequestOwners(guard)
    replica_a.record("req-1", ALICE)
    replica_a.record("req-2", RequestOwner("bob"))
    await asyncio.sleep(0.1)  # the batched write
    assert replica_a.written == 2 and replica_a.write_failures == 0
    (bucket,) = [key async for key in guard.client.scan_iter(OWNER_PREFIX + "*")]  # one hash took the batch
    assert await guard.client.hlen(bucket) == 2
    assert 3600 < await guard.client.ttl(bucket) <= 3600 + OWNER_BUCKET_S  # the hour, and the bucket's span
    store = FeedbackStore(guard)
    with structlog.testing.capture_logs() as logs:
        reply = await submit_feedback({"request_id": "req-1", "thumbs": "down", "comment": "wrong"}, "alice",
                                      replica_b, store, now=lambda: 1_700_000_000.0)
        with pytest.raises(NotFound) as other:
            await submit_feedback({"request_id": "req-2", "score": 1}, "alice", replica_b, store)
        with pytest.raises(NotFound) as unknown:
            await submit_feedback({"request_id": "req-404", "score": 1}, "alice", replica_b, store)
    assert reply == {"object": "feedback", "request_id": "req-1", "score": 0.0, "created": 1_700_000_000,
                     "experiment": "bands-v2", "arm": "treatment", "replaced": False}
    assert other.value.status == unknown.value.status == 404 and other.value.message == unknown.value.message \
        .replace("req-404", "req-2")  # another tenant's id looks exactly like an unknown one
    assert orjson.loads(error_body(other.value))["error"]["code"] == "request_not_found"
    accepted = [line for line in logs if line["event"] == "feedback"]
    assert accepted == [{"event": "feedback", "log_level": "info", "ts": "2023-11-14T22:13:20.000+00:00",
                         "request_id": "req-1", "tenant": "alice", "experiment": "bands-v2", "arm": "treatment",
                         "tier": "large-fp16", "score": 0.0, "source": "thumbs", "comment": True, "replaces": False}]
    assert [line["reason"] for line in logs if line["event"] == "feedback_refused"] == ["other_tenant", "unknown"]
    (stored,) = await store.recent("alice")
    assert stored["comment"] == "wrong" and stored["request_id"] == "req-1" and await store.recent("bob") == []


async def test_without_redis_owners_live_in_process_with_a_ttl_and_a_bound() -> None:
    now = [0.0]
    owners = RequestOwners(None, ttl_s=60, local_entries=2, clock=lambda: now[0])
    for rid in ("a", "b", "c"):
        owners.record(rid, ALICE)
    assert await owners.lookup("a") is None  # evicted: the oldest of three with room for two
    assert await owners.lookup("c") == ALICE
    now[0] = 61.0
    assert await owners.lookup("c") is None  # expired


async def test_when_redis_is_down_an_id_this_replica_does_not_know_gets_503() -> None:
    guard = RedisGuard(connect(DEAD_REDIS), op_timeout_s=0.05)
    owners = RequestOwners(guard)
    owners.record("mine", ALICE)
    await owners.flush()
    assert owners.write_failures == 1
    assert (await submit_feedback({"request_id": "mine", "score": 0.5}, "alice", owners))["score"] == 0.5
    with pytest.raises(Overloaded) as caught:
        await submit_feedback({"request_id": "elsewhere", "score": 0.5}, "alice", owners)
    assert caught.value.status == 503 and caught.value.headers() == {"Retry-After": "1"}
    assert isinstance(caught.value, GatewayError)


async def test_writes_are_batched_a_full_batch_goes_at_once_and_aclose_writes_the_rest(guard: RedisGuard) -> None:
    owners = RequestOwners(guard, batch_every_s=60, max_batch=10)
    for i in range(5):
        owners.record(f"r{i}", ALICE)
    await asyncio.sleep(0.05)
    assert owners.written == 0  # below a batch: waits for the timer
    for i in range(5, 25):
        owners.record(f"r{i}", ALICE)
    await asyncio.sleep(0.1)
    assert (owners.written, owners.flushes) == (25, 1)  # one pipeline took all that was pending
    owners.record("late", ALICE)
    await owners.aclose()
    assert owners.written == 26
    raw = await guard.client.hget(owner_bucket_key(time.time()), "r24")
    assert raw is not None and RequestOwner.decode(raw) == ALICE


async def test_an_owner_is_found_in_an_earlier_bucket_until_the_window_has_passed(guard: RedisGuard) -> None:
    wall = [1_700_000_000.0]
    writer = RequestOwners(guard, ttl_s=900, wall=lambda: wall[0])
    writer.record("early", ALICE)
    await writer.flush()
    wall[0] += 2 * OWNER_BUCKET_S + 1  # two buckets later, within 900 s
    writer.record("later", RequestOwner("bob"))
    await writer.flush()
    assert owner_bucket_key(wall[0]) != owner_bucket_key(wall[0] - 2 * OWNER_BUCKET_S - 1)
    reader = RequestOwners(guard, ttl_s=900, wall=lambda: wall[0])  # another replica: Redis only
    assert await reader.lookup("early") == ALICE and await reader.lookup("later") == RequestOwner("bob")
    wall[0] += 900 + 2 * OWNER_BUCKET_S  # past the window of both buckets: not read any more
    assert await reader.lookup("early") is None and await reader.lookup("later") is None


async def test_a_request_keeps_one_feedback_the_last_and_the_store_stays_bounded(guard: RedisGuard) -> None:
    """Issue 37: 100 posts on one request id are one feedback (the last); the oldest request ids leave first."""
    owners, store = RequestOwners(None), FeedbackStore(guard, max_entries=3)
    for rid in ("r0", "r1", "r2", "r3"):
        owners.record(rid, ALICE)
    clock = [1_700_000_000.0]
    replies = []
    for i in range(100):
        clock[0] += 1
        replies.append(await submit_feedback({"request_id": "r0", "score": i / 100}, "alice", owners, store,
                                             now=lambda: clock[0]))
    assert [r["replaced"] for r in replies] == [False] + [True] * 99
    (only,) = await store.recent("alice")
    assert (only["request_id"], only["score"]) == ("r0", 0.99)
    for rid in ("r1", "r2", "r3"):
        clock[0] += 1
        await submit_feedback({"request_id": rid, "thumbs": "up"}, "alice", owners, store, now=lambda: clock[0])
    assert [f["request_id"] for f in await store.recent("alice")] == ["r3", "r2", "r1"]  # r0, the oldest, left


async def test_feedback_is_limited_per_tenant_across_replicas(guard: RedisGuard) -> None:
    owners = RequestOwners(None)
    owners.record("r1", ALICE)
    owners.record("b1", RequestOwner("bob"))
    replica_a, replica_b = FeedbackLimiter(guard), FeedbackLimiter(guard)
    for i in range(5):
        await submit_feedback({"request_id": "r1", "score": 1}, "alice", owners,
                              limiter=replica_a if i % 2 else replica_b, per_min=5)
    with pytest.raises(RateLimited) as caught:
        await submit_feedback({"request_id": "r1", "score": 1}, "alice", owners, limiter=replica_a, per_min=5)
    assert caught.value.code == "feedback_rate_limited" and float(caught.value.headers()["Retry-After"]) >= 1
    with pytest.raises(RateLimited):  # unknown ids count too: probing is limited
        await submit_feedback({"request_id": "nope", "score": 1}, "alice", owners, limiter=replica_b, per_min=5)
    await submit_feedback({"request_id": "b1", "score": 1}, "bob", owners, limiter=replica_a, per_min=5)
    assert feedback_per_minute(None) == DEFAULT_PER_MIN and feedback_per_minute(30) == 30


async def test_without_redis_each_replica_takes_its_share_of_the_feedback_limit() -> None:
    down = RedisGuard(connect(DEAD_REDIS), op_timeout_s=0.05)
    limiter = FeedbackLimiter(down, replicas=lambda: 2)
    for _ in range(5):
        await limiter.admit("alice", 10)
    with pytest.raises(RateLimited):
        await limiter.admit("alice", 10)
    alone = FeedbackLimiter(None)
    for _ in range(10):
        await alone.admit("alice", 10)
    with pytest.raises(RateLimited):
        await alone.admit("alice", 10)


@pytest.mark.parametrize("thumbs", [{"a": 1}, ["up"], 1, None])
def test_thumbs_of_any_other_type_is_a_400_naming_the_field(thumbs: object) -> None:
    """A dict or list for `thumbs` was unhashable: a 500 the API fuzzer found; any non-string is refused."""
    body = {"request_id": "r-1", "thumbs": thumbs} if thumbs is not None else {"request_id": "r-1", "thumbs": "sideways"}
    with pytest.raises(InvalidRequest) as err:
        parse_feedback(body)
    assert err.value.param == "thumbs" and err.value.status == 400
