"""Configs around given backend URLs, with a known API key, and a difficulty scorer and a quality predictor that
read a table."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.config import GatewayConfig, PolicyConfig, RoutesConfig, Tier

TEST_API_KEY = "sk-test"
TEST_TENANT = "test-tenant"


def tier(name: str, urls: Sequence[str], *, precision: str = "int4", input_per_mtok: float = 1.0,
         output_per_mtok: float = 2.0, context_window: int = 8192, model: str = "emulated",
         tokenizer: str | None = None, quality_model: str | None = None) -> Tier:
    """A tier whose replicas are `urls` (named NAME-0, NAME-1, ...)."""
    replicas = [{"name": f"{name}-{i}", "url": url, "model": model} for i, url in enumerate(urls)]
    return Tier.model_validate({
        "name": name, "precision": precision, "context_window": context_window,
        "prices": {"input_per_mtok": input_per_mtok, "output_per_mtok": output_per_mtok},
        "replicas": replicas, "tokenizer": tokenizer, "quality_model": quality_model,
    })


TEST_BALANCING = {"near_tie": 0.0, "explore_after_s": 0.0, "health_interval_s": 0.0, "scrape_interval_s": 0.0}


def gateway_config(tiers: Sequence[Tier], *, policy: Mapping[str, Any] | None = None,
                   upstream: Mapping[str, Any] | None = None, redis_op_timeout_ms: float = 250.0,
                   balancing: Mapping[str, Any] | None = None, admission: Mapping[str, Any] | None = None,
                   ) -> GatewayConfig:
    """A config over `tiers`; the first is the default; TEST_API_KEY belongs to TEST_TENANT.

    Redis calls get a generous budget: tests assert behaviour, and a loaded CI machine must not
    turn a slow GET into a cache miss (production keeps the default of a few ms). Replica choice is
    deterministic unless `balancing` says otherwise: no random draw among near-ties, no exploration of
    replicas passed over, no background health checks or /metrics scrapes (tests of those turn them on)."""
    key_hash = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
    policy_data: dict[str, Any] = {
        "default_tier": tiers[0].name,
        "max_tokens": {"default": 64, "maximum": 1024},
        "tenants": [{"name": TEST_TENANT, "api_key_sha256": key_hash}],
        **(policy or {}),
    }
    routes = RoutesConfig.model_validate({
        "tiers": [t.model_dump() for t in tiers], "upstream": upstream or {},
        "redis": {"op_timeout_ms": redis_op_timeout_ms},
        "balancing": {**TEST_BALANCING, **(balancing or {})}, "admission": admission or {},
    })
    return GatewayConfig.build(routes, PolicyConfig.model_validate(policy_data))


class TableScorer:
    """A DifficultyScorer for tests: the difficulty given for a prompt, else `default`; may raise."""

    def __init__(self, table: Mapping[str, float], default: float = 0.0, error: Exception | None = None) -> None:
        self.table = dict(table)
        self.default = default
        self.error = error
        self.calls: list[str] = []
        self.scopes: list[str] = []

    async def score(self, text: str, *, scope: str = "*offline*") -> float:
        self.calls.append(text)
        self.scopes.append(scope)
        if self.error is not None:
            raise self.error
        return self.table.get(text, self.default)


class TableQualityPredictor:
    """A QualityPredictor for tests: the per-model scores given for a prompt, else `default`; may raise."""

    def __init__(self, table: Mapping[str, Mapping[str, float]], default: Mapping[str, float] | None = None,
                 error: Exception | None = None) -> None:
        self.table = {prompt: dict(scores) for prompt, scores in table.items()}
        self.default = dict(default or {})
        self.error = error
        self.models = tuple(sorted({m for scores in [*self.table.values(), self.default] for m in scores}))
        self.calls: list[str] = []
        self.scopes: list[str] = []
        self.closed = False

    async def predict(self, text: str, *, scope: str = "*offline*") -> dict[str, float]:
        self.calls.append(text)
        self.scopes.append(scope)
        if self.error is not None:
            raise self.error
        return dict(self.table.get(text, self.default))

    def close(self) -> None:
        self.closed = True


def routes_yaml(url: str, *, tier_name: str = "t", launch: str = "", extra: str = "") -> str:
    """A routes file with one tier of one replica at `url` (ending in /v1); `launch` is its YAML launch
    block (e.g. "{kind: emulator, profile: instant}"), `extra` more top-level YAML."""
    launch_part = f", launch: {launch}" if launch else ""
    return f"""
tiers:
  - name: {tier_name}
    precision: int4
    context_window: 4096
    prices: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}
    replicas:
      - {{name: {tier_name}-a, url: "{url}", model: m{launch_part}}}
{extra}"""
