"""The policy stage called directly: the tenant from the key, its limits on the request, and the booking after."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache.background import BackgroundWrites
from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.errors import AuthenticationFailed, BodyTooLarge, InvalidRequest, RateLimited
from gateway.limits.limiter import Limiter
from gateway.limits.replicas import Replicas
from gateway.metrics import GatewayMetrics
from gateway.stages.policy import KnownKeys, PolicyStage
from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, parsed_context, run_finishers, tier
from gateway.types import Endpoint

TIERS = [tier("small", ["http://127.0.0.1:9/v1"])]
CONFIG = gateway_config(TIERS)  # max_tokens: default 64, maximum 1024 (clamp)
CHAT: dict[str, Any] = {"model": "small", "messages": [{"role": "user", "content": "hello there"}]}


async def admitted(body: dict[str, Any] = CHAT, config: GatewayConfig = CONFIG, api_key: str | None = TEST_API_KEY,
                   stage: PolicyStage | None = None, endpoint: Endpoint = "chat") -> RequestContext:
    ctx = await parsed_context(config, body, api_key=api_key, endpoint=endpoint)
    assert await (stage or PolicyStage())(ctx) is None
    return ctx


async def test_a_known_key_names_its_tenant() -> None:
    ctx = await admitted()
    assert ctx.tenant is not None and ctx.tenant.name == TEST_TENANT
    assert ctx.finishers == []  # no limiter: nothing to book


async def test_an_unknown_key_is_401() -> None:
    with pytest.raises(AuthenticationFailed) as caught:
        await admitted(api_key="sk-wrong")
    assert (caught.value.status, caught.value.message) == (401, "invalid API key")


async def test_no_key_is_anonymous_where_the_policy_allows_it_and_401_elsewhere() -> None:
    with pytest.raises(AuthenticationFailed) as caught:
        await admitted(api_key=None)
    assert caught.value.status == 401 and "missing API key" in caught.value.message
    ctx = await admitted(api_key=None, config=gateway_config(TIERS, policy={"allow_anonymous": True}))
    assert ctx.tenant is not None and ctx.tenant.name == "anonymous" and ctx.tenant_name == "anonymous"


@pytest.mark.parametrize(("asked", "limit"), [(None, 64), (10, 10), (1024, 1024), (5000, 1024)])
async def test_max_tokens_takes_the_default_and_is_clamped_to_the_maximum(asked: int | None, limit: int) -> None:
    ctx = await admitted(CHAT if asked is None else {**CHAT, "max_tokens": asked})
    assert ctx.max_tokens == limit and ctx.body["max_tokens"] == limit


async def test_max_completion_tokens_is_clamped_in_place() -> None:
    ctx = await admitted({**CHAT, "max_completion_tokens": 5000})
    assert ctx.max_tokens == 1024 and ctx.body["max_completion_tokens"] == 1024 and "max_tokens" not in ctx.body


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_max_tokens_over_the_maximum_is_400_naming_the_field_when_the_policy_rejects(field: str) -> None:
    config = gateway_config(TIERS, policy={"max_tokens": {"default": 64, "maximum": 1024, "on_exceed": "reject"}})
    assert (await admitted({**CHAT, field: 1024}, config)).max_tokens == 1024
    with pytest.raises(InvalidRequest) as caught:
        await admitted({**CHAT, field: 1025}, config)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, field, "max_tokens_exceeded")
    assert error.message == f"'{field}' of 1025 exceeds the maximum of 1024 for tenant 'test-tenant'"


async def test_the_output_cap_lowers_max_tokens_further() -> None:
    ctx = await admitted({**CHAT, "max_tokens": 500}, gateway_config(TIERS, policy={"output_cap": {"tokens": 100}}))
    assert ctx.max_tokens == 100 and ctx.body["max_tokens"] == 100


@pytest.mark.parametrize(("endpoint", "body", "param"), [
    ("chat", {**CHAT, "messages": [{"role": "user", "content": "x" * 11}]}, "messages"),
    ("completions", {"model": "small", "prompt": "x" * 11}, "prompt"),
])
async def test_a_prompt_over_the_tenants_size_is_413_naming_the_field(endpoint: Endpoint, body: dict[str, Any],
                                                                    param: str) -> None:
    config = gateway_config(TIERS, policy={"max_prompt_chars": 10})
    with pytest.raises(BodyTooLarge) as caught:
        await admitted(body, config, endpoint=endpoint)
    error = caught.value
    assert (error.status, error.param, error.code) == (413, param, "prompt_too_large")
    assert "11 characters" in error.message and "allows 10" in error.message
    fits = {**body, "messages": [{"role": "user", "content": "x" * 10}]} if endpoint == "chat" else {
        **body, "prompt": "x" * 10}
    assert (await admitted(fits, config, endpoint=endpoint)).tenant is not None


@pytest.mark.parametrize(("asked", "sent"), [
    (None, ["END", "###"]),
    ("STOP", ["STOP", "END", "###"]),
    (["###", "STOP"], ["###", "STOP", "END"]),  # a sequence the client sent is not repeated
])
async def test_the_tenants_stop_sequences_are_added_to_the_clients(asked: str | list[str] | None,
                                                                   sent: list[str]) -> None:
    config = gateway_config(TIERS, policy={"stop": ["END", "###"]})
    ctx = await admitted(CHAT if asked is None else {**CHAT, "stop": asked}, config)
    assert ctx.body["stop"] == sent


async def test_known_keys_are_remembered_per_config_and_forgotten_on_a_new_one() -> None:
    keys = KnownKeys()
    tenant = keys.tenant(CONFIG, TEST_API_KEY)
    assert keys.tenant(CONFIG, TEST_API_KEY) is tenant  # the memo: no second hash and lookup
    reloaded = gateway_config(TIERS, policy={"max_tokens": {"default": 8, "maximum": 16}})
    assert keys.tenant(reloaded, TEST_API_KEY).max_tokens.maximum == 16  # the new config's tenant, not the memo's
    revoked = gateway_config(TIERS, policy={"tenants": []})
    with pytest.raises(AuthenticationFailed):
        keys.tenant(revoked, TEST_API_KEY)  # a key removed on reload is refused at once
    with pytest.raises(AuthenticationFailed):
        keys.tenant(CONFIG, "sk-wrong")


def local_limiter() -> Limiter:
    """The real limiter without Redis: it decides on this process's windows and budgets."""
    return Limiter(None, BackgroundWrites(), Replicas(None, lambda: 1), GatewayMetrics())


async def test_the_booking_finisher_charges_the_cost_accounting_set_to_the_daily_budget() -> None:
    stage = PolicyStage(local_limiter())
    config = gateway_config(TIERS, policy={"daily_budget_usd": 0.01})
    ctx = await admitted(config=config, stage=stage)
    assert len(ctx.finishers) == 1
    await admitted(config=config, stage=stage)  # nothing booked yet: still within budget
    ctx.upstream.upstream_started, ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens = True, 3, 5
    ctx.result.cost_usd = 0.02  # what accounting sets, after the stages and before the finishers
    run_finishers(ctx)
    with pytest.raises(RateLimited) as caught:
        await admitted(config=config, stage=stage)
    assert (caught.value.status, caught.value.code) == (429, "budget_exhausted")


@pytest.mark.parametrize(("used", "admitted_next"), [(10, True), (64, False)])
async def test_the_booking_finisher_corrects_the_token_charge_to_the_tokens_used(used: int,
                                                                                 admitted_next: bool) -> None:
    stage = PolicyStage(local_limiter())
    config = gateway_config(TIERS, policy={"rate_limit": {"tokens_per_min": 100}})
    body = {**CHAT, "messages": [{"role": "user", "content": "hi"}]}  # charged 0 + 64 (max_tokens) on admission
    ctx = await admitted(body, config, stage=stage)
    ctx.upstream.upstream_started, ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens = True, 1, used - 1
    run_finishers(ctx)
    if admitted_next:
        await admitted(body, config, stage=stage)  # 10 used + 64 charged fits in 100
    else:
        with pytest.raises(RateLimited) as caught:
            await admitted(body, config, stage=stage)
        assert caught.value.code == "rate_limit_tokens"
