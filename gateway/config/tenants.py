"""TenantPolicy: a tenant's limits with every default resolved, compiled once when the file loads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from gateway.config.policies import (
    CacheRule, Limits, MaxTokens, OutputCap, PolicyConfig, Priority, RateLimit, Routing,
)

T = TypeVar("T")
ANONYMOUS = "anonymous"
BUILTIN_MAX_TOKENS = MaxTokens(default=256, maximum=4096)


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    name: str
    default_tier: str
    allowed_tiers: frozenset[str] | None
    max_tokens: MaxTokens
    max_prompt_chars: int | None
    output_cap: OutputCap | None
    stop: tuple[str, ...]
    priority: Priority
    ttft_slo_ms: float | None
    brownout: bool
    rate_limit: RateLimit | None
    daily_budget_usd: float | None
    cache: CacheRule
    routing: Routing | None

    def allows(self, tier: str) -> bool:
        return self.allowed_tiers is None or tier in self.allowed_tiers


def resolve(name: str, own: Limits, policy: PolicyConfig) -> TenantPolicy:
    """`own` over the policy's top level over the built-in defaults, field by field."""
    allowed = _first(own.allowed_tiers, policy.allowed_tiers)
    return TenantPolicy(
        name=name,
        default_tier=_first(own.default_tier, policy.default_tier) or "",
        allowed_tiers=None if allowed is None else frozenset(allowed),
        max_tokens=_first(own.max_tokens, policy.max_tokens) or BUILTIN_MAX_TOKENS,
        max_prompt_chars=_first(own.max_prompt_chars, policy.max_prompt_chars),
        output_cap=_first(own.output_cap, policy.output_cap),
        stop=_first(own.stop, policy.stop) or (),
        priority=_first(own.priority, policy.priority) or "interactive",
        ttft_slo_ms=_first(own.ttft_slo_ms, policy.ttft_slo_ms),
        brownout=bool(_first(own.brownout, policy.brownout)),
        rate_limit=_first(own.rate_limit, policy.rate_limit),
        daily_budget_usd=_first(own.daily_budget_usd, policy.daily_budget_usd),
        cache=_first(own.cache, policy.cache) or CacheRule(),
        routing=_first(own.routing, policy.routing),
    )


def _first(own: T | None, inherited: T | None) -> T | None:
    return inherited if own is None else own


def compile_tenants(policy: PolicyConfig) -> tuple[Mapping[str, TenantPolicy], TenantPolicy | None]:
    """(tenants by API key hash, the anonymous tenant where the policy allows one)."""
    by_hash = {t.api_key_sha256: resolve(t.name, t, policy) for t in policy.tenants}
    anonymous = resolve(ANONYMOUS, Limits(), policy) if policy.allow_anonymous else None
    return by_hash, anonymous
