"""The route stage called directly: the tier a model names (or 'auto' picks), its checks, and its ranked replicas."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from gateway.backends.pool import Lease, ReplicaPool
from gateway.config import GatewayConfig, Tier
from gateway.context import RequestContext
from gateway.errors import InvalidRequest, PermissionDenied, UnknownModel
from gateway.stages.policy import PolicyStage
from gateway.testing import TEST_API_KEY, gateway_config, parsed_context, routed as route, tier
from gateway.types import Endpoint

SMALL = tier("small", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"], context_window=2048)
LARGE = tier("large", ["http://127.0.0.1:11/v1"])
EMBEDDER = Tier.model_validate({"name": "minilm", "precision": "fp32", "context_window": 256,
                                "prices": {"input_per_mtok": 1.0, "output_per_mtok": 0}, "embedder": {"kind": "minilm"}})
BANDS = {"bands": [{"tier": "small", "below": 0.5}, {"tier": "large"}]}
CONFIG = gateway_config([SMALL, LARGE, EMBEDDER], policy={"routing": BANDS,
                                                          "max_tokens": {"default": 64, "maximum": 8192}})
SMALL, LARGE, EMBEDDER = (CONFIG.tiers[name] for name in ("small", "large", "minilm"))  # the config's own
PROMPT = "What is the capital of France? Answer in one word."
CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": PROMPT}]}
LIMITED_KEY = "sk-small-only"


async def routed(body: dict[str, Any] = CHAT, *, config: GatewayConfig = CONFIG, difficulty: float | None = None,
                 pool: ReplicaPool | None = None, api_key: str = TEST_API_KEY,
                 endpoint: Endpoint = "chat") -> RequestContext:
    """A context through parse and policy, with the classifier's `difficulty`, then the route stage."""
    ctx = await parsed_context(config, body, api_key=api_key, endpoint=endpoint)
    await PolicyStage()(ctx)
    ctx.route.difficulty = difficulty
    await route(ctx, pool or ReplicaPool())
    return ctx


async def test_a_named_tier_is_taken_with_its_replicas_and_the_prompts_size() -> None:
    ctx = await routed({**CHAT, "model": "large"})
    assert ctx.route.tier is LARGE and ctx.route.candidates == LARGE.replicas
    assert ctx.prompt_tokens_est == ctx.input_tokens_est() == -(-len(PROMPT) // 4) == 13  # the reading's estimate


async def test_an_unknown_model_is_404_listing_the_models() -> None:
    with pytest.raises(UnknownModel) as caught:
        await routed({**CHAT, "model": "gpt-7"})
    error = caught.value
    assert (error.status, error.code, error.param) == (404, "model_not_found", "model")  # OpenAI's answer
    assert error.message == "the model 'gpt-7' does not exist; use one of: auto, small, large, minilm"


@pytest.mark.parametrize(("difficulty", "tier_name"), [(0.0, "small"), (0.49, "small"), (0.5, "large"),
                                                       (1.0, "large"), (None, "small")])
async def test_auto_takes_the_difficulty_bands_tier_or_the_default(difficulty: float | None, tier_name: str) -> None:
    ctx = await routed(difficulty=difficulty)
    assert ctx.route.tier is not None and ctx.route.tier.name == tier_name


def small_only_config(**policy: Any) -> GatewayConfig:
    """CONFIG with a second tenant (LIMITED_KEY) allowed only the small tier."""
    tenant = {"name": "small-only", "api_key_sha256": hashlib.sha256(LIMITED_KEY.encode()).hexdigest(),
              "allowed_tiers": ["small"]}
    base = CONFIG.policy.model_dump(exclude_none=True)
    return gateway_config([SMALL, LARGE], policy={**base, "tenants": [*base["tenants"], tenant], **policy})


async def test_a_tier_the_tenant_may_not_use_is_403_and_auto_falls_back_to_its_default() -> None:
    config = small_only_config()
    with pytest.raises(PermissionDenied) as caught:
        await routed({**CHAT, "model": "large"}, config=config, api_key=LIMITED_KEY)
    error = caught.value
    assert (error.status, error.code, error.param) == (403, "tier_not_allowed", "model")
    assert "may not use tier 'large' (allowed: small)" in error.message
    ctx = await routed(config=config, api_key=LIMITED_KEY, difficulty=0.9)  # the band says large
    assert ctx.route.tier is not None and ctx.route.tier.name == "small"
    assert (await routed({**CHAT, "model": "large"}, config=config)).route.tier == LARGE  # the other tenant may


async def test_max_tokens_over_the_tiers_context_window_is_400() -> None:
    assert (await routed({**CHAT, "model": "small", "max_tokens": 2048})).max_tokens == 2048
    with pytest.raises(InvalidRequest) as caught:
        await routed({**CHAT, "model": "small", "max_tokens": 2049})
    error = caught.value
    assert (error.status, error.param) == (400, "max_tokens")
    assert "'max_tokens' of 2049 exceeds the context window of tier 'small' (2048 tokens)" == error.message
    assert (await routed({**CHAT, "model": "large", "max_tokens": 2049})).route.tier is LARGE  # 8192 tokens there


async def test_embedding_tiers_serve_only_the_embeddings_endpoint_and_back() -> None:
    ctx = await routed({"model": "auto", "input": "hello"}, endpoint="embeddings")
    assert ctx.route.tier is EMBEDDER and ctx.route.candidates == ()  # served in process: no replicas
    with pytest.raises(InvalidRequest) as chat_there:
        await routed({**CHAT, "model": "minilm"})
    assert chat_there.value.param == "model"
    assert "'minilm' is an embedding model: use it on /v1/embeddings" in chat_there.value.message
    with pytest.raises(InvalidRequest) as embed_here:
        await routed({"model": "small", "input": "hello"}, endpoint="embeddings")
    assert "'small' is not an embedding model: use it on /v1/chat/completions" in embed_here.value.message


async def test_candidates_are_ranked_by_predicted_ttft_and_unavailable_replicas_left_out() -> None:
    pool = ReplicaPool()
    first, second = SMALL.replicas
    assert (await routed({**CHAT, "model": "small"}, pool=pool)).route.candidates == (first, second)
    Lease(pool, first, SMALL, 4000, 0, CONFIG.routes.balancing)  # a long prompt prefilling on the first
    assert (await routed({**CHAT, "model": "small"}, pool=pool)).route.candidates == (second, first)
    pool.state(second).healthy = False
    assert (await routed({**CHAT, "model": "small"}, pool=pool)).route.candidates == (first,)
