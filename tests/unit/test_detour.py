"""Model 'auto' routed to a tier with no healthy replica goes to the nearest healthy tier (gateway.routing.detour)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.routing.detour import nearest_healthy
from gateway.stages.policy import PolicyStage
from gateway.testing import TEST_API_KEY, gateway_config, parsed_context, routed as route, tier

BANDS = {"bands": [{"tier": "small", "below": 0.3}, {"tier": "medium", "below": 0.6}, {"tier": "large"}]}
TIERS = [tier("small", ["http://127.0.0.1:9/v1"]), tier("medium", ["http://127.0.0.1:10/v1"]),
         tier("large", ["http://127.0.0.1:11/v1"], context_window=4096)]
CONFIG = gateway_config(TIERS, policy={"routing": BANDS})
CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "Hi"}]}
SMALL_KEY, STUCK_KEY = "sk-small-medium", "sk-no-detour"


def config_with(extra_tenants: list[dict[str, Any]], **policy: Any) -> GatewayConfig:
    tenants = [{"name": "test-tenant", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}]
    for extra in extra_tenants:
        key = extra.pop("key")
        tenants.append({**extra, "api_key_sha256": hashlib.sha256(key.encode()).hexdigest()})
    return gateway_config(TIERS, policy={"routing": BANDS, "tenants": tenants, **policy})


def down(pool: ReplicaPool, config: GatewayConfig, *names: str) -> None:
    for name in names:
        for replica in config.tiers[name].replicas:
            pool.state(replica, config.tiers[name]).healthy = False


async def routed(pool: ReplicaPool, difficulty: float, body: dict[str, Any] = CHAT, config: GatewayConfig = CONFIG,
                 api_key: str = TEST_API_KEY) -> RequestContext:
    ctx = await parsed_context(config, body, api_key=api_key)
    await PolicyStage()(ctx)
    ctx.route.difficulty = difficulty
    await route(ctx, pool)
    return ctx


@pytest.mark.parametrize(("dead", "difficulty", "served"), [
    (("medium",), 0.5, "large"),  # up first
    (("large",), 0.9, "medium"),  # nothing above: the nearest below
    (("medium", "large"), 0.5, "small"),
    (("small",), 0.1, "medium"),
])
async def test_auto_goes_to_the_nearest_healthy_tier_up_first(dead: tuple[str, ...], difficulty: float,
                                                              served: str) -> None:
    pool = ReplicaPool()
    down(pool, CONFIG, *dead)
    ctx = await routed(pool, difficulty)
    assert ctx.route.tier is not None and ctx.route.tier.name == served
    assert ctx.route.rerouted_from == dead[0]  # the band's tier
    assert ctx.route.candidates == CONFIG.tiers[served].replicas


async def test_a_healthy_tier_is_not_rerouted_and_a_named_one_never() -> None:
    pool = ReplicaPool()
    ctx = await routed(pool, 0.5)
    assert ctx.route.tier is not None and (ctx.route.tier.name, ctx.route.rerouted_from) == ("medium", None)
    down(pool, CONFIG, "medium")
    named = await routed(pool, 0.5, {**CHAT, "model": "medium"})
    assert named.route.tier is not None and (named.route.tier.name, named.route.candidates, named.route.rerouted_from) == ("medium", (), None)


async def test_only_tiers_the_tenant_may_use_and_that_fit_max_tokens() -> None:
    config = config_with([{"name": "limited", "key": SMALL_KEY, "allowed_tiers": ["small", "medium"]}],
                         max_tokens={"default": 64, "maximum": 8192})
    pool = ReplicaPool()
    down(pool, config, "medium")
    limited = await routed(pool, 0.5, config=config, api_key=SMALL_KEY)  # large is not allowed: down to small
    assert limited.route.tier is not None and (limited.route.tier.name, limited.route.rerouted_from) == ("small", "medium")
    big = await routed(pool, 0.5, {**CHAT, "max_tokens": 6000}, config=config)  # large's window is 4096
    assert big.route.tier is not None and (big.route.tier.name, big.route.rerouted_from) == ("small", "medium")


async def test_the_policy_switch_keeps_the_request_on_its_tier() -> None:
    config = config_with([{"name": "stuck", "key": STUCK_KEY, "detour": False}])
    pool = ReplicaPool()
    down(pool, config, "medium")
    ctx = await routed(pool, 0.5, config=config, api_key=STUCK_KEY)
    assert ctx.route.tier is not None and (ctx.route.tier.name, ctx.route.candidates, ctx.route.rerouted_from) == ("medium", (), None)
    other = await routed(pool, 0.5, config=config)  # the switch is the tenant's own
    assert other.route.rerouted_from == "medium"


async def test_nothing_healthy_leaves_the_request_on_its_tier() -> None:
    pool = ReplicaPool()
    down(pool, CONFIG, "small", "medium", "large")
    ctx = await routed(pool, 0.5)
    assert ctx.route.tier is not None and (ctx.route.tier.name, ctx.route.candidates, ctx.route.rerouted_from) == ("medium", (), None)


def test_an_open_circuit_counts_as_down() -> None:
    pool = ReplicaPool()
    medium = CONFIG.tiers["medium"]
    breaker = pool.state(medium.replicas[0], medium).breaker
    for _ in range(CONFIG.routes.balancing.breaker.failures):
        breaker.on_failure(CONFIG.routes.balancing.breaker)
    target = nearest_healthy(CONFIG.routes.tiers, medium, None, None, pool.has_available)
    assert target is not None and target.name == "large"


def test_the_switch_is_validated_like_other_policy_fields() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="detour"):
        config_with([{"name": "bad", "key": "sk-x", "detour": "sometimes"}])
