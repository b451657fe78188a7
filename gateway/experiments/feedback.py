"""`POST /v1/feedback` without the web framework: parse, tenant-check, store and log a score.

    owners = RequestOwners(guard)                 # app start; `await owners.aclose()` at shutdown
    owners.record(ctx.request_id, RequestOwner(tenant, experiment, arm, tier))   # a request finished
    reply = await submit_feedback(raw_body, tenant_name, owners, FeedbackStore(guard))   # the endpoint

The body is `{"request_id": "<x-request-id of the answer>", "score": 0.0..1.0}` or `{"request_id": ...,
"thumbs": "up" | "down"}` (up = 1, down = 0), with an optional `comment` (at most MAX_COMMENT characters).
The request id must belong to the caller's tenant: the map request id -> owner is written when a
request finishes (in process at once; in Redis in batches, one hash per five minutes of wall time, so a
batch is one command however many requests it holds, kept `ttl_s` to `ttl_s` + 5 minutes). An unknown id, an expired
one and another tenant's one get the same 404, so a tenant cannot probe for others' request ids.
When the id is in neither this process nor Redis because Redis is down, the answer is 503 (retry).
Errors are GatewayErrors: the edge renders them as the OpenAI error JSON (`gateway.errors.error_body`).

Feedback cannot be turned into training weight (issue 37):
- **Limited per tenant.** `FeedbackLimiter`: posts per sliding minute per tenant, across the gateway's replicas
  (Redis; per process against 1/N of the limit while Redis cannot answer, as `gateway.limits` does). The limit
  is the tenant's `rate_limit.requests_per_min` when it has one (a tenant cannot have more answers a minute
  to score than requests), else DEFAULT_PER_MIN; over it, a 429 `feedback_rate_limited` with Retry-After. The
  limit is checked before the request id is looked up, so probing ids is limited too.
- **Deduplicated per request id, last wins.** The store keeps one feedback per request id (a hash per tenant,
  bounded by an order set: the oldest ids leave first); a second post on an id replaces the first, and its
  log line says `replaces: true`. Readers of the log (`gateway experiments report`, `gateway train
  --from-outcomes`: gateway.training.traffic_outcomes) take the last line per request id.
- **Weighted per tenant when training**: gateway.training.traffic_outcomes averages a prompt's labels within
  each tenant first, then across tenants, so one tenant's volume cannot outweigh another tenant's data.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog

from gateway.cache.guard import RedisGuard
from gateway.errors import InvalidRequest, NotFound, Overloaded, RateLimited
from gateway.limits.local import LocalWindows
from gateway.limits.window import WINDOW_S, WindowPosition, retry_after

log = structlog.get_logger("gateway.requests")

THUMBS = {"up": 1.0, "down": 0.0}
MAX_COMMENT = 2000
FIELDS = ("request_id", "score", "thumbs", "comment")
REQUEST_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
OWNER_PREFIX = "reqowner:"
OWNER_BUCKET_S = 300  # the owners recorded in these seconds of wall time share one Redis hash
# A Redis write costs ~0.3 ms of the gateway's CPU whatever it holds (redis-py), ~1.5 us more per owner: at
# 450 req/s, batches of 50 ms cost 15 us per request and batches of 250 ms 4 us. Feedback reaching another
# replica within this time of its answer is not found there (the replica that answered always finds it).
OWNER_BATCH_S = 0.25
# Owners kept in process: 244 bytes each (tracemalloc), 24 MB at 100,000, which a soak at 120 req/s saw as
# RSS growing 1.4 MB a minute while they filled. With Redis they only bridge the batch and serve as a fast
# path: 10,000 cover seconds of traffic in 2.4 MB. Without Redis they are the store.
LOCAL_OWNERS_WITH_REDIS = 10_000
LOCAL_OWNERS_ALONE = 100_000
FEEDBACK_PREFIX = "feedback:"  # feedback:{tenant}:by_id (hash) and feedback:{tenant}:order (sorted set)
RATE_PREFIX = "fbrate:"
DEFAULT_PER_MIN = 600  # feedback posts a minute for a tenant without a requests_per_min limit
WRITE_TIMEOUT_S = 1.0  # batched background writes and the feedback endpoint: not the request path's 5 ms budget


@dataclass(frozen=True, slots=True)
class RequestOwner:
    """Who a request belonged to, and the arm it was served by."""

    tenant: str
    experiment: str | None = None
    arm: str | None = None
    tier: str | None = None

    def encode(self) -> bytes:
        return orjson.dumps([self.tenant, self.experiment, self.arm, self.tier])

    @classmethod
    def decode(cls, raw: bytes | str) -> RequestOwner | None:
        try:
            tenant, experiment, arm, tier = orjson.loads(raw)
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return None
        return cls(tenant, experiment, arm, tier) if isinstance(tenant, str) else None


class RequestOwners:
    """request id -> RequestOwner for `ttl_s`: in this process (an LRU of `local_entries`, fewer with Redis)
    and in Redis (shared by the gateway's replicas; written every `batch_every_s` as one HSET into the hash
    of the current OWNER_BUCKET_S, which expires `ttl_s` after the bucket's last write). Redis holds ~150
    bytes per request (100 req/s for the default hour is ~55 MB), so `ttl_s` is the window in which an
    application may send feedback."""

    def __init__(self, guard: RedisGuard | None, *, ttl_s: int = 3600, local_entries: int | None = None,
                 batch_every_s: float = OWNER_BATCH_S, max_batch: int = 256,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.guard = guard
        self._wall = wall
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ttl_s = ttl_s
        self.local_entries = local_entries or (LOCAL_OWNERS_WITH_REDIS if guard else LOCAL_OWNERS_ALONE)
        self.batch_every_s = batch_every_s
        self.max_batch = max_batch
        self._clock = clock
        self._local: OrderedDict[str, tuple[RequestOwner, float]] = OrderedDict()
        self._pending: list[tuple[str, bytes]] = []
        self._flush_scheduled = False
        self._flush_started = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.flushes = 0  # pipelines sent
        self.written = 0  # owners written to Redis
        self.write_failures = 0  # batches Redis did not take (the owners stay in this process only)

    def record(self, request_id: str, owner: RequestOwner) -> None:
        """Remember the owner (never blocks, never raises: a request finisher)."""
        self._local[request_id] = (owner, self._clock() + self.ttl_s)
        self._local.move_to_end(request_id)
        while len(self._local) > self.local_entries:
            self._local.popitem(last=False)
        if self.guard is None:
            return
        self._pending.append((request_id, owner.encode()))
        loop = self._loop
        if loop is None or loop.is_closed():  # asking asyncio costs a getpid() syscall: once per loop
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a script): `flush()` writes them
                return
        if len(self._pending) >= self.max_batch and not self._flush_started:
            self._spawn(loop)
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_later(self.batch_every_s, self._timer, loop)

    def _timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush_scheduled = False
        if self._pending and not self._flush_started:
            self._spawn(loop)

    def _spawn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush_started = True  # until that flush takes the batch: one flush for all that is pending
        task = loop.create_task(self.flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        """Write the owners recorded since the last flush to Redis: one HSET into the current bucket's hash."""
        batch, self._pending, self._flush_started = self._pending, [], False
        self.flushes += bool(batch)
        if not batch or self.guard is None:
            return
        client, key, expire_s = self.guard.client, owner_bucket_key(self._wall()), self.ttl_s + OWNER_BUCKET_S

        async def write() -> bool:
            pipe = client.pipeline(transaction=False)
            pipe.hset(key, mapping=dict(batch))
            pipe.expire(key, expire_s)
            await pipe.execute()
            return True

        if await self.guard.run("feedback_owner_set", write, WRITE_TIMEOUT_S, key=key):
            self.written += len(batch)
        else:
            self.write_failures += 1

    async def lookup(self, request_id: str) -> RequestOwner | None:
        """The owner, or None when the id is unknown or expired; raises Overloaded when only Redis could tell
        and Redis is unavailable."""
        owner, local = None, self._local.get(request_id)
        if local is not None:
            if self._clock() < local[1]:
                owner = local[0]
            else:
                del self._local[request_id]
        if self.guard is None:
            return owner
        # Redis is read whatever this process knows (issue 37): an id it served, another tenant's say, costs the
        # same round trip as an unknown one, so the answer's timing does not tell them apart
        client, now = self.guard.client, self._wall()
        buckets = [owner_bucket_key(now - back * OWNER_BUCKET_S) for back in range(self.ttl_s // OWNER_BUCKET_S + 2)]

        async def read() -> list[bytes | str | None]:
            pipe = client.pipeline(transaction=False)
            for key in buckets:
                pipe.hget(key, request_id)
            return list(await pipe.execute())

        found = await self.guard.run("feedback_owner_get", read, WRITE_TIMEOUT_S, key=buckets)
        if found is None:
            if owner is not None:
                return owner
            raise Overloaded("feedback cannot be checked right now (request store unavailable); retry",
                             code="feedback_store_unavailable", retry_after=1)
        raw = next((value for value in found if value is not None), None)
        stored = None if raw is None else RequestOwner.decode(raw)
        return owner if owner is not None else stored

    async def aclose(self) -> None:
        """Write what is pending (at shutdown)."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.flush()


def owner_bucket_key(wall_s: float) -> str:
    """The Redis hash holding the owners recorded at `wall_s` (Unix seconds)."""
    return f"{OWNER_PREFIX}{int(wall_s // OWNER_BUCKET_S)}"


@dataclass(frozen=True, slots=True)
class Feedback:
    """One accepted feedback, as stored and logged."""

    ts: str
    request_id: str
    owner: RequestOwner
    score: float
    source: str  # "score" | "thumbs"
    comment: str | None

    def log_fields(self) -> dict[str, Any]:
        """The `feedback` log line (the comment stays out of the log: it may be long or personal)."""
        return {"ts": self.ts, "request_id": self.request_id, "tenant": self.owner.tenant,
                "experiment": self.owner.experiment, "arm": self.owner.arm, "tier": self.owner.tier,
                "score": self.score, "source": self.source, "comment": self.comment is not None}

    def stored(self) -> dict[str, Any]:
        return {**self.log_fields(), "comment": self.comment}


# KEYS: by_id order   ARGV: request_id json score(ms) max_entries
# returns 1 when the request id already had feedback (this one replaces it), else 0
ADD_LUA = """
local fresh = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #old, 2 do redis.call('HDEL', KEYS[1], old[i]) end
end
return fresh == 0 and 1 or 0
"""


def store_keys(tenant: str) -> tuple[str, str]:
    """(the hash request id -> feedback, the sorted set of request ids by time): one Redis Cluster slot per tenant."""
    return f"{FEEDBACK_PREFIX}{{{tenant}}}:by_id", f"{FEEDBACK_PREFIX}{{{tenant}}}:order"


class FeedbackStore:
    """Accepted feedback per tenant, one per request id (last wins), at most max_entries request ids per
    tenant (the oldest leave first)."""

    def __init__(self, guard: RedisGuard, max_entries: int = 100_000) -> None:
        self.guard = guard
        self.max_entries = max_entries
        self._script = guard.client.register_script(ADD_LUA)

    async def add(self, feedback: Feedback) -> bool | None:
        """Store it: False when new, True when it replaced an earlier feedback on the same request id, None when
        Redis did not take it."""
        keys = list(store_keys(feedback.owner.tenant))
        args: list[bytes | str | int] = [feedback.request_id, orjson.dumps(feedback.stored()), _millis(feedback.ts),
                                         self.max_entries]
        script = self._script

        async def write() -> int:
            return int(await script(keys=keys, args=args))

        replaced = await self.guard.run("feedback_add", write, WRITE_TIMEOUT_S)
        return None if replaced is None else bool(replaced)

    async def recent(self, tenant: str, count: int = 100) -> list[dict[str, Any]]:
        """The tenant's latest feedback, one per request id, newest first ([] when Redis is unavailable)."""
        client = self.guard.client
        by_id, order = store_keys(tenant)

        async def read() -> list[Any]:
            ids = [i for i in await client.zrevrange(order, 0, count - 1) if isinstance(i, (bytes, str))]
            return list(await client.hmget(by_id, ids)) if ids else []

        entries = await self.guard.run("feedback_recent", read, WRITE_TIMEOUT_S) or []
        return [orjson.loads(raw) for raw in entries if raw is not None]


def _millis(ts: str) -> int:
    return int(datetime.fromisoformat(ts).timestamp() * 1000)


# KEYS: cur prev   ARGV: limit prev_weight ttl   returns {allowed, cur, prev}
RATE_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur + prev * tonumber(ARGV[2]) + 1 > tonumber(ARGV[1]) then return {0, cur, prev} end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {1, cur, prev}
"""


def feedback_per_minute(requests_per_min: int | None) -> int:
    """A tenant's feedback limit: its request limit when it has one (it has no more answers to score), else
    DEFAULT_PER_MIN."""
    return requests_per_min if requests_per_min is not None else DEFAULT_PER_MIN


class FeedbackLimiter:
    """Feedback posts per tenant per sliding minute, across replicas through Redis; per process, against
    1/`replicas()` of the limit, when there is no Redis or it does not answer."""

    def __init__(self, guard: RedisGuard | None, replicas: Callable[[], int] = lambda: 1,
                 clock: Callable[[], float] = time.time) -> None:
        self.guard = guard
        self._replicas = replicas
        self._clock = clock
        self._script = guard.client.register_script(RATE_LUA) if guard is not None else None
        self._local = LocalWindows()

    async def admit(self, tenant: str, per_min: int) -> None:
        """Count one post; RateLimited (429 + Retry-After) when the tenant is over its limit."""
        position = WindowPosition.at(self._clock())
        reply = None
        if self.guard is not None and self._script is not None:
            keys = [f"{RATE_PREFIX}{{{tenant}}}:{position.index}", f"{RATE_PREFIX}{{{tenant}}}:{position.index - 1}"]
            args = [per_min, position.previous_weight, 2 * WINDOW_S]
            script = self._script

            async def run() -> list[Any]:
                return list(await script(keys=keys, args=args))

            reply = await self.guard.run("feedback_rate", run, WRITE_TIMEOUT_S)
        if reply is not None:
            allowed, current, previous = (int(v) for v in reply)
            if allowed:
                self._local.charge([(tenant, 1.0)], position)
                return
            wait = retry_after(float(current), float(previous), 1, per_min, position)
        else:
            local = self._local.admit(tenant, 1, per_min / max(1, self._replicas()), position)
            if local is None:
                return
            wait = local
        log.info("feedback_refused", tenant=tenant, reason="rate_limited")
        raise RateLimited(f"tenant {tenant!r} is over its feedback limit of {per_min} a minute",
                          code="feedback_rate_limited", retry_after=wait)


def parse_feedback(body: bytes | Mapping[str, Any]) -> tuple[str, float, str, str | None]:
    """(request_id, score in [0, 1], source, comment); InvalidRequest naming the field otherwise."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise InvalidRequest(f"the body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(body, Mapping):
        raise InvalidRequest("the body must be a JSON object", code="invalid_body")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field {unknown[0]!r}: feedback takes {', '.join(FIELDS)}", param=unknown[0])
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not REQUEST_ID.match(request_id):
        raise InvalidRequest("'request_id' must be the x-request-id of an answer (1-128 characters: letters, "
                             "digits, _ . : -)", param="request_id")
    score, thumbs = body.get("score"), body.get("thumbs")
    if (score is None) == (thumbs is None):
        raise InvalidRequest("give one of 'score' (a number in [0, 1]) and 'thumbs' ('up' or 'down')",
                             param="score")
    if thumbs is not None:
        if not isinstance(thumbs, str) or thumbs not in THUMBS:  # a list or object is not hashable: a 400 too
            raise InvalidRequest(f"'thumbs' must be 'up' or 'down', got {str(thumbs)[:40]!r}", param="thumbs")
        value, source = THUMBS[thumbs], "thumbs"
    else:
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
            raise InvalidRequest(f"'score' must be a number in [0, 1], got {score!r}", param="score")
        value, source = float(score), "score"
    comment = body.get("comment")
    if comment is not None and (not isinstance(comment, str) or len(comment) > MAX_COMMENT):
        raise InvalidRequest(f"'comment' must be a string of at most {MAX_COMMENT} characters", param="comment")
    assert math.isfinite(value)
    return request_id, value, source, comment


async def submit_feedback(
    body: bytes | Mapping[str, Any], tenant: str, owners: RequestOwners, store: FeedbackStore | None = None,
    *, limiter: FeedbackLimiter | None = None, per_min: int = DEFAULT_PER_MIN, now: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """The endpoint's core: the JSON reply for an accepted feedback; raises InvalidRequest (400), RateLimited
    (429: over the tenant's `per_min` feedback posts a minute), NotFound (404: unknown, expired or another
    tenant's request id) or Overloaded (503: the owner store is unavailable)."""
    request_id, score, source, comment = parse_feedback(body)
    if limiter is not None:
        await limiter.admit(tenant, per_min)
    owner = await owners.lookup(request_id)
    if owner is None or owner.tenant != tenant:
        log.info("feedback_refused", request_id=request_id, tenant=tenant,
                 reason="unknown" if owner is None else "other_tenant")
        hours = owners.ttl_s / 3600
        raise NotFound(f"no request {request_id!r} for this API key (unknown, older than {hours:g} h, "
                       "or not this tenant's)", param="request_id", code="request_not_found")
    created = now()
    feedback = Feedback(datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds"), request_id, owner,
                        score, source, comment)
    replaced = await store.add(feedback) if store is not None else None
    log.info("feedback", **feedback.log_fields(), replaces=replaced)  # None: no store (or Redis did not take it)
    return {"object": "feedback", "request_id": request_id, "score": score, "created": int(created),
            "experiment": owner.experiment, "arm": owner.arm, "replaced": bool(replaced)}
