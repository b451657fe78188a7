"""Policy files: tenants and their limits. The top level holds the defaults, each tenant may override
any of them; `compile_tenants` turns both into one frozen `TenantPolicy` per tenant at load time."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gateway.config.routes import Frozen

Priority = Literal["interactive", "batch"]


class MaxTokens(Frozen):
    """`default` fills a request without max_tokens; above `maximum` a request is clamped or rejected."""

    default: int = Field(ge=1)
    maximum: int = Field(ge=1)
    on_exceed: Literal["clamp", "reject"] = "clamp"

    @model_validator(mode="after")
    def _default_within_maximum(self) -> MaxTokens:
        if self.default > self.maximum:
            raise ValueError(f"default ({self.default}) must not exceed maximum ({self.maximum})")
        return self


class OutputCap(Frozen):
    """Ends a streamed answer with finish_reason "length" at this many output tokens and/or characters."""

    tokens: int | None = Field(default=None, ge=1)
    chars: int | None = Field(default=None, ge=1)


class RateLimit(Frozen):
    """Per tenant, across all gateway replicas (Redis), per minute."""

    requests_per_min: int | None = Field(default=None, ge=1)
    tokens_per_min: int | None = Field(default=None, ge=1, description="prompt + max_tokens, charged on admission")


class Band(Frozen):
    """Difficulty below `below` (the last band: up to 1.0 inclusive) routes to `tier`."""

    tier: str = Field(min_length=1)
    below: float | None = Field(default=None, gt=0.0, le=1.0)


class Routing(Frozen):
    """How model "auto" picks a tier: the classifier's difficulty in [0, 1], cut into bands."""

    classifier: str = Field(default="models/difficulty", description="folder of a trained difficulty model")
    bands: tuple[Band, ...] = Field(min_length=1)

    @field_validator("bands")
    @classmethod
    def _ordered_and_closed(cls, bands: tuple[Band, ...]) -> tuple[Band, ...]:
        cuts = [band.below for band in bands[:-1]]
        if any(cut is None for cut in cuts):
            raise ValueError("every band but the last needs `below`")
        if cuts != sorted(set(cuts)):  # type: ignore[type-var]
            raise ValueError(f"`below` must increase from band to band, got {cuts}")
        if bands[-1].below not in (None, 1.0):
            raise ValueError("the last band must reach 1.0: leave out its `below`")
        return bands

    def tier_for(self, difficulty: float) -> str:
        for band in self.bands:
            if band.below is not None and difficulty < band.below:
                return band.tier
        return self.bands[-1].tier


class SemanticRule(Frozen):
    """Serve a cached answer to a paraphrase: cosine similarity of the prompts' embeddings >= threshold."""

    threshold: float = Field(default=0.95, gt=0.0, le=1.0)


class CacheRule(Frozen):
    """When answers are cached in Redis and replayed."""

    enabled: bool = True
    mode: Literal["deterministic", "always"] = Field(
        default="deterministic", description="deterministic: only requests with temperature 0 or a seed"
    )
    ttl_s: int = Field(default=3600, ge=1)
    shared: bool = Field(default=False, description="serve one tenant's cached answers to other tenants")
    semantic: SemanticRule | None = None


class Limits(Frozen):
    """What a tenant may do. Unset fields inherit the policy file's top level, then the built-in defaults."""

    allowed_tiers: tuple[str, ...] | None = Field(default=None, description="tiers it may use (unset: all)")
    default_tier: str | None = Field(default=None, description="where model 'auto' goes without bands")
    max_tokens: MaxTokens | None = None
    max_prompt_chars: int | None = Field(default=None, ge=1, description="larger prompts get 413")
    output_cap: OutputCap | None = None
    stop: tuple[str, ...] | None = Field(default=None, description="stop sequences added to every request")
    priority: Priority | None = Field(default=None, description="interactive requests leave the queue first")
    ttft_slo_ms: float | None = Field(
        default=None, gt=0, description="shed with 503 when the predicted time to first token exceeds it"
    )
    brownout: bool | None = Field(
        default=None, description="model 'auto' may go to the tier's brownout_to tier when the tier is saturated"
    )
    rate_limit: RateLimit | None = None
    daily_budget_usd: float | None = Field(default=None, ge=0)
    cache: CacheRule | None = None
    routing: Routing | None = Field(default=None, description="classifier bands; without them auto = default_tier")


class Tenant(Limits):
    name: str = Field(min_length=1)
    api_key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the API key")


class PolicyConfig(Limits):
    allow_anonymous: bool = Field(default=False, description="requests without an API key: tenant 'anonymous'")
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    baseline_tier: str | None = Field(
        default=None, description="savings are measured against this tier (default: the highest output price)"
    )
    admin_api_key_sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$", description="key for /admin/* (unset: admin endpoints off)"
    )
    dashboard_viewer_keys_sha256: tuple[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")], ...] = Field(
        default=(), description="hex SHA-256 of keys that may open GET /dashboard (read-only; the admin key may too)"
    )
    tenants: tuple[Tenant, ...] = ()

    @model_validator(mode="after")
    def _has_default_tier(self) -> PolicyConfig:
        if self.default_tier is None:
            raise ValueError("default_tier is required at the top level")
        return self

    @field_validator("tenants")
    @classmethod
    def _unique_tenants(cls, tenants: tuple[Tenant, ...]) -> tuple[Tenant, ...]:
        seen: set[str] = set()
        for tenant in tenants:
            if tenant.name in seen or tenant.api_key_sha256 in seen:
                raise ValueError(f"tenant {tenant.name!r} repeats a name or an API key")
            seen.update((tenant.name, tenant.api_key_sha256))
        return tenants
