"""The limiter's local share: while Redis cannot decide, each replica admits the limit divided by the
replicas it knows of (heartbeats, or `redis.expected_replicas`), and says so (log line, metric)."""

from __future__ import annotations

import hashlib

import pytest
import structlog

from gateway.cache.background import BackgroundWrites
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.config.tenants import TenantPolicy
from gateway.errors import RateLimited
from gateway.limits.limiter import Limiter
from gateway.limits.replicas import Replicas
from gateway.local.redis_server import free_port
from gateway.metrics import GatewayMetrics
from gateway.testing import gateway_config, tier


def tenant_with(**limits: object) -> TenantPolicy:
    key_hash = hashlib.sha256(b"sk-a").hexdigest()
    config = gateway_config([tier("t", ["http://127.0.0.1:1/v1"])],
                            policy={"tenants": [{"name": "a", "api_key_sha256": key_hash, **limits}]})
    return config.tenants_by_key_hash[key_hash]


async def admitted(limiter: Limiter, tenant: TenantPolicy, count: int, cost: int = 1) -> int:
    passed = 0
    for _ in range(count):
        try:
            await limiter.admit(tenant, cost)
            passed += 1
        except RateLimited:
            pass
    return passed


@pytest.mark.parametrize(("expected", "share"), [(1, 30), (3, 10), (4, 7)])
async def test_without_redis_each_replica_admits_its_share(expected: int, share: int) -> None:
    metrics = GatewayMetrics()
    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: expected), metrics)
    assert await admitted(limiter, tenant_with(rate_limit={"requests_per_min": 30}), 40) == share
    assert metrics.registry.get_sample_value("gateway_replicas") == expected


async def test_the_token_limit_is_shared_too() -> None:
    limiter = Limiter(None, BackgroundWrites(), Replicas(None, lambda: 2), GatewayMetrics())
    assert await admitted(limiter, tenant_with(rate_limit={"tokens_per_min": 100}), 10, cost=10) == 5


async def test_a_redis_that_does_not_answer_falls_back_to_the_share_visibly() -> None:
    guard = RedisGuard(connect(f"redis://127.0.0.1:{free_port()}"), op_timeout_s=0.01)  # nothing listens there
    metrics = GatewayMetrics()
    replicas = Replicas(guard, lambda: 1)
    replicas.seen = 3  # what heartbeats reported while Redis was up
    limiter = Limiter(guard, BackgroundWrites(), replicas, metrics, timeout_s=0.05)
    with structlog.testing.capture_logs() as logs:
        assert await admitted(limiter, tenant_with(rate_limit={"requests_per_min": 30}), 20) == 10
    assert not guard.up
    assert metrics.registry.get_sample_value("gateway_limits_local_decisions_total", {"reason": "redis_down"}) == 20
    [line] = [entry for entry in logs if entry["event"] == "limits_local"]
    assert (line["reason"], line["replicas"]) == ("redis_down", 3)
    await guard.client.aclose()


async def test_expected_replicas_is_a_floor_under_what_heartbeats_saw() -> None:
    replicas = Replicas(None, lambda: 4)
    replicas.seen = 2
    assert replicas.count == 4
