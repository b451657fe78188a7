"""Limiter: admits a request against its tenant's rate limits and daily budget, and books what it used.

Global across gateway replicas: one Lua script checks both minute windows and the day's spend and
charges the windows atomically, in one round trip (a script rather than a limiter library: no extra
dependency, one round trip, and the exact semantics we document). The script gets its own budget
(`redis.limits_timeout_ms`, far above the caches' `op_timeout_ms`): under a burst a reply is late
because the event loop is busy, and deciding without it would let the burst through.

When Redis cannot decide (down, or no reply within that budget), the same arithmetic runs per
process (LocalWindows) against this replica's share: each limit divided by the number of replicas
(`Replicas.count`), so that N replicas together stay within the limit. The local windows are also
charged for what Redis admitted, so a replica that spent its share before an outage has no more.
Local decisions are counted (`gateway_limits_local_decisions_total{reason}`) and logged
(`limits_local`, at most once per `WARN_EVERY_S` per reason).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from gateway.cache.background import BackgroundWrites
from gateway.clock import day_key
from gateway.cache.guard import RedisGuard
from gateway.config.tenants import TenantPolicy
from gateway.errors import RateLimited
from gateway.limits.local import LocalBudgets, LocalWindows
from gateway.limits.replicas import Replicas
from gateway.limits.window import WINDOW_S, WindowPosition, retry_after
from gateway.metrics import GatewayMetrics

WARN_EVERY_S = 10.0

log = structlog.get_logger("gateway.limits")

# KEYS: req:cur req:prev tok:cur tok:prev budget:day
# ARGV: req_limit tok_limit tok_cost prev_weight ttl budget_limit   (a limit of -1: none)
# returns {0|1, denied_by, cur, prev}
ADMIT_LUA = """
local function used(cur, prev) return tonumber(redis.call('GET', cur) or '0'), tonumber(redis.call('GET', prev) or '0') end
local w = tonumber(ARGV[4])
local budget = tonumber(ARGV[6])
if budget >= 0 and tonumber(redis.call('GET', KEYS[5]) or '0') >= budget then return {0, 'budget', '0', '0'} end
local rc, rp = used(KEYS[1], KEYS[2])
local req_limit = tonumber(ARGV[1])
if req_limit >= 0 and rc + rp * w + 1 > req_limit then return {0, 'requests', tostring(rc), tostring(rp)} end
local tc, tp = used(KEYS[3], KEYS[4])
local tok_limit, cost = tonumber(ARGV[2]), tonumber(ARGV[3])
if tok_limit >= 0 and tc + tp * w + cost > tok_limit then return {0, 'tokens', tostring(tc), tostring(tp)} end
if req_limit >= 0 then redis.call('INCRBY', KEYS[1], 1); redis.call('EXPIRE', KEYS[1], ARGV[5]) end
if tok_limit >= 0 then redis.call('INCRBY', KEYS[3], cost); redis.call('EXPIRE', KEYS[3], ARGV[5]) end
return {1, '', '0', '0'}
"""


class Limiter:
    def __init__(self, guard: RedisGuard | None, writes: BackgroundWrites, replicas: Replicas,
                 metrics: GatewayMetrics, *, timeout_s: float = 2.0) -> None:
        self._guard = guard
        self._writes = writes
        self._replicas = replicas
        self._metrics = metrics
        self.timeout_s = timeout_s
        self._script = guard.client.register_script(ADMIT_LUA) if guard else None
        self._windows = LocalWindows()
        self._budgets = LocalBudgets()
        self._warned: dict[str, float] = {}
        self.local_decisions: Counter[str] = Counter()  # per tenant name: decided without Redis (bounded: the policy's tenants)
        metrics.replicas.set_function(lambda: replicas.count)

    async def admit(self, tenant: TenantPolicy, token_cost: int) -> None:
        """Raise RateLimited (429 + Retry-After) when a limit or the day's budget is used up."""
        rate, budget = tenant.rate_limit, tenant.daily_budget_usd
        if rate is None and budget is None:
            return
        now = time.time()
        position, day = WindowPosition.at(now), day_key(now)
        reply = await self._admit_redis(tenant, token_cost, position, day) if self._script else None
        if reply is None:
            self._admit_local(tenant, token_cost, position, day, self._local_reason(spend_key(tenant, day)))
            return
        allowed, denied_by, current, previous = reply
        reason = _text(denied_by)
        if int(allowed):
            self._windows.charge(_charges(tenant, token_cost), position)
            return
        if reason == "budget":
            _deny(tenant, reason, 0.0)
        cost = 1 if reason == "requests" else token_cost
        _deny(tenant, reason, retry_after(float(current), float(previous), cost, _limit_of(tenant, reason), position))

    def book(self, tenant: TenantPolicy, token_delta: int, cost_usd: float) -> None:
        """After the answer: correct the token charge to the tokens used, and add the spend (background)."""
        rate = tenant.rate_limit
        tokens = rate is not None and rate.tokens_per_min is not None and token_delta != 0
        spend = tenant.daily_budget_usd is not None and cost_usd > 0
        if not (tokens or spend):  # most requests of most tenants: nothing to book
            return
        now = time.time()
        if tokens:
            position = WindowPosition.at(now)
            self._windows.adjust(local_key(tenant, "tok"), token_delta, position)
            tok_key = rate_key(tenant, "tok", position.index)
            self._redis_later(lambda c: c.incrby(tok_key, token_delta), tok_key)
        if spend:
            day = day_key(now)
            self._budgets.add(tenant.name, day, cost_usd)
            budget_key = spend_key(tenant, day)
            self._redis_later(lambda c: _add_spend(c, budget_key, cost_usd), budget_key)

    async def _admit_redis(self, tenant: TenantPolicy, token_cost: int, position: WindowPosition,
                           day: str) -> list[Any] | None:
        assert self._guard is not None and self._script is not None
        rate = tenant.rate_limit
        keys = [rate_key(tenant, "req", position.index), rate_key(tenant, "req", position.index - 1),
                rate_key(tenant, "tok", position.index), rate_key(tenant, "tok", position.index - 1),
                spend_key(tenant, day)]
        args = [_or_none(rate.requests_per_min if rate else None), _or_none(rate.tokens_per_min if rate else None),
                token_cost, position.previous_weight, 2 * WINDOW_S, _or_none(tenant.daily_budget_usd)]
        script = self._script
        reply: list[Any] | None = await self._guard.run("limits_admit", lambda: script(keys=keys, args=args),
                                                        self.timeout_s, key=keys[0])  # one slot: {tenant}
        return reply

    def _admit_local(self, tenant: TenantPolicy, token_cost: int, position: WindowPosition, day: str,
                     reason: str) -> None:
        """Decide on this replica's share of each limit (the limit divided by the replicas)."""
        replicas = self._replicas.count
        self._metrics.limits_local.labels(reason).inc()
        self.local_decisions[tenant.name] += 1
        self._warn(reason, replicas)
        budget = tenant.daily_budget_usd
        if budget is not None and self._budgets.spent(tenant.name, day) >= budget / replicas:
            _deny(tenant, "budget", 0.0)
        rate = tenant.rate_limit
        if rate is not None and rate.requests_per_min is not None:
            wait = self._windows.admit(local_key(tenant, "req"), 1, rate.requests_per_min / replicas, position)
            if wait is not None:
                _deny(tenant, "requests", wait)
        if rate is not None and rate.tokens_per_min is not None:
            wait = self._windows.admit(local_key(tenant, "tok"), token_cost, rate.tokens_per_min / replicas, position)
            if wait is not None:
                _deny(tenant, "tokens", wait)

    def _local_reason(self, key: str) -> str:
        if self._guard is None:
            return "no_redis"
        return "redis_down" if not self._guard.up_for(key) else "redis_no_answer"

    def _warn(self, reason: str, replicas: int) -> None:
        now = time.monotonic()
        if reason != "no_redis" and now - self._warned.get(reason, -WARN_EVERY_S) >= WARN_EVERY_S:
            self._warned[reason] = now
            log.warning("limits_local", reason=reason, replicas=replicas)

    def _redis_later(self, write: Any, key: str) -> None:
        if self._guard is not None:
            guard = self._guard
            self._writes.spawn(guard.run("limits_book", lambda: write(guard.client), key=key))


async def _add_spend(client: Any, key: str, usd: float) -> None:
    async with client.pipeline(transaction=False) as pipe:
        pipe.incrbyfloat(key, usd)
        pipe.expire(key, 2 * 86400)
        await pipe.execute()


def _charges(tenant: TenantPolicy, token_cost: int) -> list[tuple[str, float]]:
    """What an admission charges the local windows: one request, `token_cost` tokens (where limited)."""
    rate = tenant.rate_limit
    if rate is None:
        return []
    return ([(local_key(tenant, "req"), 1.0)] if rate.requests_per_min is not None else []) + (
        [(local_key(tenant, "tok"), float(token_cost))] if rate.tokens_per_min is not None else [])


def _deny(tenant: TenantPolicy, reason: str, wait_s: float) -> None:
    if reason == "budget":
        raise RateLimited(f"tenant {tenant.name!r} has used its daily budget of ${tenant.daily_budget_usd}",
                          code="budget_exhausted", retry_after=_seconds_to_midnight())
    unit = "requests" if reason == "requests" else "tokens"
    raise RateLimited(f"tenant {tenant.name!r} is over its {unit} per minute limit", code=f"rate_limit_{unit}",
                      retry_after=wait_s)


def _limit_of(tenant: TenantPolicy, reason: str) -> float:
    rate = tenant.rate_limit
    if rate is None:
        return 0.0
    return float((rate.requests_per_min if reason == "requests" else rate.tokens_per_min) or 0)


def rate_key(tenant: TenantPolicy, kind: str, index: int) -> str:
    return f"rl:{{{tenant.name}}}:{kind}:{index}"  # one hash slot per tenant (Redis Cluster)


def local_key(tenant: TenantPolicy, kind: str) -> str:
    return f"{tenant.name}:{kind}"


def spend_key(tenant: TenantPolicy, day: str) -> str:
    return f"rl:{{{tenant.name}}}:usd:{day}"


def _or_none(value: float | None) -> float:
    return -1 if value is None else value


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _seconds_to_midnight() -> float:
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight - now).total_seconds()
