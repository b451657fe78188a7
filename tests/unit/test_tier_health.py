"""Backend health per tier (/readyz's rule) and the Retry-After of a tier with no replica to try (issue 30)."""

from __future__ import annotations

import time

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.backends.tier_health import backends_health, tier_health
from gateway.config import Tier
from gateway.context import RequestContext
from gateway.errors import Overloaded
from gateway.metrics import GatewayMetrics
from gateway.upstream.attempt import failover
from gateway.testing import gateway_config, request_context, tier

EMBEDDER = Tier.model_validate({"name": "minilm", "precision": "fp32", "context_window": 256,
                                "prices": {"input_per_mtok": 1.0, "output_per_mtok": 0}, "embedder": {"kind": "minilm"}})
CONFIG = gateway_config([tier("small", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]),
                         tier("large", ["http://127.0.0.1:11/v1"]), EMBEDDER], balancing={"health_interval_s": 5.0})
SMALL, LARGE = CONFIG.tiers["small"], CONFIG.tiers["large"]


def fail_health(pool: ReplicaPool, tier: Tier, index: int, checked_ago_s: float) -> None:
    state = pool.state(tier.replicas[index], tier)
    state.healthy, state.checked_at = False, time.monotonic() - checked_ago_s


def test_ready_degraded_unready_per_tier_and_in_sum() -> None:
    pool = ReplicaPool()
    assert backends_health(pool, CONFIG.routes.tiers, 5.0) == ("ready", {
        "small": {"status": "ready", "up": 2, "replicas": 2, "retry_in_s": 0.0},
        "large": {"status": "ready", "up": 1, "replicas": 1, "retry_in_s": 0.0}})  # the embedder runs in process
    fail_health(pool, SMALL, 0, 1.0)
    fail_health(pool, LARGE, 0, 1.0)
    summary, each = backends_health(pool, CONFIG.routes.tiers, 5.0)
    assert summary == "degraded" and (each["small"]["status"], each["small"]["up"]) == ("degraded", 1)
    assert each["large"]["status"] == "unready" and each["large"]["retry_in_s"] == pytest.approx(4.0, abs=0.05)
    fail_health(pool, SMALL, 1, 1.0)
    assert backends_health(pool, CONFIG.routes.tiers, 5.0)[0] == "unready"


def test_an_open_circuit_is_not_up() -> None:
    pool = ReplicaPool()
    breaker = pool.state(LARGE.replicas[0], LARGE).breaker
    for _ in range(CONFIG.routes.balancing.breaker.failures):
        breaker.on_failure(CONFIG.routes.balancing.breaker)
    health = tier_health(pool, LARGE, 5.0)
    assert health["status"] == "unready" and 0 < health["retry_in_s"] <= CONFIG.routes.balancing.breaker.cooldown_s


@pytest.mark.parametrize(("checked_ago_s", "retry_after"), [(1.0, "4"), (4.7, "1"), (0.2, "5")])
async def test_retry_after_follows_the_next_health_check(checked_ago_s: float, retry_after: str) -> None:
    """Before: `Retry-After: 1` whatever the health-check interval (only open circuits counted)."""
    pool = ReplicaPool()
    fail_health(pool, LARGE, 0, checked_ago_s)
    ctx: RequestContext = request_context(CONFIG, {"model": "large", "messages": []})
    ctx.route.tier = LARGE

    async def never(replica: object) -> None:
        raise AssertionError("no replica may be tried")

    with pytest.raises(Overloaded) as caught:
        await failover(ctx, pool, GatewayMetrics(), never)
    assert caught.value.code == "no_replica_available" and caught.value.headers()["Retry-After"] == retry_after


def test_retry_in_is_the_sooner_of_a_replicas_cooldown_and_its_next_check() -> None:
    pool = ReplicaPool()
    fail_health(pool, SMALL, 0, 1.0)  # next check in 4 s
    state = pool.state(SMALL.replicas[1], SMALL)
    for _ in range(CONFIG.routes.balancing.breaker.failures):
        state.breaker.on_failure(CONFIG.routes.balancing.breaker)
    cooldown = CONFIG.routes.balancing.breaker.cooldown_s
    assert pool.retry_in(SMALL, 5.0) == pytest.approx(min(4.0, cooldown), abs=0.05)
    assert state.retry_in(0.0) == pytest.approx(cooldown, abs=0.05)  # health checks off: the circuit alone
