"""Policy files: tenants and their limits. The top level holds the defaults, each tenant may override
any of them; `compile_tenants` turns both into one frozen `TenantPolicy` per tenant at load time."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PlainValidator, WithJsonSchema, field_validator, model_validator

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


def _quality_floor(value: object) -> float | bool:
    """A number from 0 to 1, or `false` (YAML's false is not 0.0, nor is 0 false): one error naming both."""
    if value is False:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    raise ValueError("must be a number from 0 to 1 (the predicted quality a cheaper tier may give up), "
                     "or false (off)")


QualityFloor = Annotated[float | bool, PlainValidator(_quality_floor), WithJsonSchema(
    {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"const": False}]})]
QUALITY_FLOOR_HELP = (
    "model 'auto' by predicted answer quality: the cheapest tier whose predicted quality (the quality predictor's "
    "score for the tier's quality_model in routes/) is within this of the best tier's; 0 takes the best tier, 1 "
    "the cheapest; false turns it off. Without a prediction (no predictor, or it failed) the bands apply")

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
IMPLICIT_CONTROL = "control"
TierMap = dict[str, str]


class Arm(Frozen):
    """One arm of an experiment: a share of the tenant's traffic, served with these fields in place of the
    tenant's own (each set field replaces the tenant's, as a tenant's field replaces the top level's)."""

    name: str = Field(pattern=NAME_PATTERN, max_length=64)
    share: float = Field(gt=0.0, le=1.0, description="share of the tenant's requests (sticky per user / conversation)")
    control: bool = Field(default=False, description="the arm the others are compared with; it overrides nothing")
    routing: Routing | None = Field(default=None, description="classifier bands for model 'auto'")
    default_tier: str | None = Field(default=None, description="where model 'auto' goes without bands")
    tier_map: TierMap | None = Field(default=None, description="a tier the request would go to -> the tier serving it")
    max_tokens: MaxTokens | None = None
    quality_floor: QualityFloor | None = Field(default=None, description=QUALITY_FLOOR_HELP)

    @model_validator(mode="after")
    def _control_overrides_nothing(self) -> Arm:
        if self.control and self.overrides():
            raise ValueError(f"the control arm {self.name!r} must not override anything "
                             f"(got {', '.join(self.overrides())})")
        return self

    def overrides(self) -> tuple[str, ...]:
        """The names of the policy fields this arm replaces."""
        return tuple(name for name in OVERRIDABLE if getattr(self, name) is not None)


OVERRIDABLE = ("routing", "default_tier", "tier_map", "max_tokens", "quality_floor")


class Experiment(Frozen):
    """Named arms, each a share of the tenant's traffic. With a `control: true` arm, requests outside every arm
    are not in the experiment; without one, they form the implicit control arm named "control"."""

    name: str = Field(pattern=NAME_PATTERN, max_length=64, description="also salts the assignment hash")
    arms: tuple[Arm, ...] = Field(min_length=1)
    sticky_by: Literal["conversation", "user"] = Field(
        default="conversation", description="what keeps a request in its arm (with the tenant): its conversation "
        "(system prompt and first user message), or the request's `user` field (a client then picks its arm by "
        "the `user` it sends; without one, the conversation)")

    @field_validator("arms")
    @classmethod
    def _shares_and_control(cls, arms: tuple[Arm, ...]) -> tuple[Arm, ...]:
        names = [arm.name for arm in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        total = sum(arm.share for arm in arms)
        if total > 1.0 + 1e-9:
            raise ValueError(f"arm shares sum to {total:g}, more than 1")
        controls = [arm.name for arm in arms if arm.control]
        if len(controls) > 1:
            raise ValueError(f"exactly one control arm, got {len(controls)}: {controls}")
        if not controls:
            if IMPLICIT_CONTROL in names:
                raise ValueError(f"an arm named {IMPLICIT_CONTROL!r} must set `control: true`")
            if total >= 1.0 - 1e-9:
                raise ValueError("arm shares sum to 1 and no arm is `control: true`: "
                                 "leave a share for the implicit control or mark one arm as control")
        return arms

    @property
    def control_arm(self) -> str:
        return next((arm.name for arm in self.arms if arm.control), IMPLICIT_CONTROL)

    @property
    def covers_all(self) -> bool:
        """Every request lands in an arm (the implicit control takes the rest, or the shares sum to 1)."""
        return not any(arm.control for arm in self.arms) or sum(arm.share for arm in self.arms) >= 1.0 - 1e-9


class Resume(Frozen):
    """A stream that breaks after its first byte continues on another replica, from the text sent (issue 32)."""

    enabled: bool = True
    max_attempts: int = Field(default=2, ge=1, le=16, description="continuations tried per request")


class Sessions(Frozen):
    """Sticky tiers for model 'auto': a conversation keeps the tier its turns were routed to, moving only up."""

    ttl_s: int = Field(default=1800, ge=1, le=30 * 86400, description="a session ends this long after its last turn")


class Shadow(Frozen):
    """Resend a share of the requests answered by tier `from` to tier `to` in the background (batch priority,
    not counted against the tenant's limits, skipped under admission pressure) and score the answers' agreement."""

    share: float = Field(gt=0.0, le=1.0, description="share of the requests `from` answered that are resent")
    from_tier: str = Field(alias="from", min_length=1, description="the tier whose answers are checked")
    to_tier: str = Field(alias="to", min_length=1, description="the reference tier")
    judge: str | None = Field(default=None, min_length=1, description="a tier that grades the pair (optional)")
    max_pairs: int = Field(default=10000, ge=1, le=10_000_000, description="pairs kept per tenant (Redis stream)")

    @model_validator(mode="after")
    def _two_tiers(self) -> Shadow:
        if self.from_tier == self.to_tier:
            raise ValueError(f"`from` and `to` name the same tier ({self.from_tier!r})")
        return self


class Spill(Frozen):
    """Model 'auto' under load (issue 39): when the chosen tier's best replica is predicted to answer later than
    `ttft_slo_ms` (queue included), the cheapest tier predicted to meet it and to lose at most `max_quality_loss`
    of predicted quality serves instead (with bands only: the next tier down); else the choice stays."""

    ttft_slo_ms: float = Field(gt=0, description="spill when the chosen tier's predicted TTFT exceeds this")
    max_quality_loss: float = Field(
        default=0.02, ge=0.0, le=1.0,
        description="the predicted quality a spill may give up (quality_floor's predictions; bands: next tier down)")
    spill_up: bool = Field(
        default=False, description="a dearer tier may serve too (a saturated small tier, an idle large one)")


class Escalate(Frozen):
    """An answer whose confidence is low goes to the next tier up the tenant may use (issue 39): the geometric
    mean of its tokens' probabilities below `min_confidence` (gateway.routing.escalate). Requests of one output
    without tools; streams only with `hold_tokens`."""

    min_confidence: float = Field(ge=0.0, le=1.0, description="escalate an answer whose confidence is below this")
    measure: Literal["geometric_mean", "least_token"] = Field(
        default="geometric_mean", description="the answer's confidence: the geometric mean of its tokens' "
        "probabilities (length-normalized), or its least likely token's probability (short answers: docs/BENCHMARKS.md)")
    hold_tokens: int | None = Field(
        default=None, ge=1, le=64, description="streams: hold the first K tokens, decide on their confidence, then "
        "stream (the client's first token waits for K; unset: streams never escalate)")


def _check_experiments(experiments: tuple[Experiment, ...] | None) -> tuple[Experiment, ...] | None:
    if not experiments:
        return experiments
    names = [e.name for e in experiments]
    if len(set(names)) != len(names):
        raise ValueError(f"experiment names must be unique, got {names}")
    for before, after in zip(experiments, experiments[1:]):
        if before.covers_all:
            raise ValueError(f"experiment {before.name!r} takes every request, so {after.name!r} after it would get "
                             "none: mark one of its arms `control: true` with a share, leaving the rest outside")
    return experiments


class Limits(Frozen):
    """What a tenant may do. Unset fields inherit the policy file's top level, then the built-in defaults."""

    allowed_tiers: tuple[str, ...] | None = Field(default=None, description="tiers it may use (unset: all)")
    default_tier: str | None = Field(default=None, description="where model 'auto' goes without bands")
    max_tokens: MaxTokens | None = None
    max_prompt_chars: int | None = Field(
        default=None, ge=1, description="larger input gets 413: characters of every message, content part and tool "
        "(a media part by the length of its data or URL), 4 per token id")
    max_prompt_tokens: int | None = Field(
        default=None, ge=1, description="larger input gets 413: estimated tokens (text / 4, token ids, 765 a media part)")
    output_cap: OutputCap | None = None
    stop: tuple[str, ...] | None = Field(default=None, description="stop sequences added to every request")
    priority: Priority | None = Field(default=None, description="interactive requests leave the queue first")
    ttft_slo_ms: float | None = Field(
        default=None, gt=0, description="shed with 503 when the predicted time to first token exceeds it"
    )
    brownout: bool | None = Field(
        default=None, description="model 'auto' may go to the tier's brownout_to tier when the tier is saturated"
    )
    detour: bool | None = Field(
        default=None, description="model 'auto' goes to the nearest healthy tier the tenant may use when its tier "
        "has no healthy replica (up first, then down); false: 503 instead (unset: true)"
    )
    rate_limit: RateLimit | None = None
    daily_budget_usd: float | None = Field(default=None, ge=0)
    cache: CacheRule | None = None
    routing: Routing | None = Field(default=None, description="classifier bands; without them auto = default_tier")
    quality_floor: QualityFloor | None = Field(default=None, description=QUALITY_FLOOR_HELP)
    tier_map: TierMap | None = Field(
        default=None, description="a tier the request would go to (named or by 'auto') -> the tier serving it (once)"
    )
    experiments: tuple[Experiment, ...] | None = Field(
        default=None, description="named experiments on the tenant's traffic; a tenant's list replaces the top level's"
    )
    shadow: Shadow | None = None
    resume: Resume | None = Field(default=None, description="mid-stream failover by continuation (default: on, 2 tries)")
    sessions: Sessions | None = Field(default=None, description="sticky tiers per conversation (default: off)")
    spill: Spill | Literal[False] | None = Field(
        default=None, description="model 'auto': another tier when the chosen one is predicted to miss a TTFT SLO "
        "(false: off where the top level sets it)")
    escalate: Escalate | Literal[False] | None = Field(
        default=None, description="a low-confidence answer goes to the next tier up (false: off where the top level "
        "sets it)")

    @field_validator("experiments")
    @classmethod
    def _experiments_apart(cls, experiments: tuple[Experiment, ...] | None) -> tuple[Experiment, ...] | None:
        return _check_experiments(experiments)

    def experiment_tier_references(self, prefix: str = "") -> list[tuple[str, str]]:
        """(field, tier name) for every tier the tier map, the experiments' arms and the shadow rule name."""
        refs = [(f"{prefix}tier_map.{key}", name) for key, value in (self.tier_map or {}).items()
                for name in (key, value)]
        for i, experiment in enumerate(self.experiments or ()):
            for j, arm in enumerate(experiment.arms):
                at = f"{prefix}experiments[{i}].arms[{j}]."
                if arm.default_tier:
                    refs.append((f"{at}default_tier", arm.default_tier))
                bands = arm.routing.bands if arm.routing else ()
                refs += [(f"{at}routing.bands[{k}].tier", band.tier) for k, band in enumerate(bands)]
                refs += [(f"{at}tier_map.{key}", name) for key, value in (arm.tier_map or {}).items()
                         for name in (key, value)]
        if self.shadow is not None:
            refs += [(f"{prefix}shadow.from", self.shadow.from_tier), (f"{prefix}shadow.to", self.shadow.to_tier)]
            if self.shadow.judge:
                refs.append((f"{prefix}shadow.judge", self.shadow.judge))
        return refs


# Names the gateway's own scopes use (gateway.keyspace): requests without a key, data shared by policy, offline
# tools. A tenant of such a name would share that scope's caches and limits, so none may have one.
RESERVED_TENANT_NAMES = frozenset({"anonymous", "*shared*", "*offline*"})
RESERVED_CHARACTERS = "*{}"  # '*' marks the internal scopes; braces are Redis Cluster hash tags in tenant keys


def reserved_reason(name: str) -> str | None:
    """Why `name` may not name a tenant (None: it may)."""
    if name.casefold() in RESERVED_TENANT_NAMES:
        return (f"{name!r} is reserved: the gateway's own scope of that name (requests without a key, data "
                "shared by policy, offline tools) would be this tenant's too; pick another name")
    bad = sorted({c for c in name if c in RESERVED_CHARACTERS})
    if bad:
        return (f"tenant names may not hold {' or '.join(repr(c) for c in bad)}: '*' marks the gateway's "
                "internal scopes and braces are Redis Cluster hash tags in the tenant's keys")
    return None


class Tenant(Limits):
    name: str = Field(min_length=1, description="not a reserved name: anonymous, or any holding '*', '{' or '}'")
    api_key_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the API key")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if (reason := reserved_reason(name)) is not None:
            raise ValueError(reason)
        return name


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
    metrics_keys_sha256: tuple[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")], ...] = Field(
        default=(), description="hex SHA-256 of bearer tokens that may scrape the /metrics series naming tenants "
        "(without one a scrape gets the others; the admin key and GATEWAY_METRICS_TOKEN may too)")
    quality_predictor: str = Field(
        default="models/router", min_length=1,
        description="folder of the trained quality predictor that quality_floor routes on (one per gateway)")
    log_replay_fields: bool = Field(
        default=True, description="each request line carries what `gateway whatif` replays it from (keys and "
        "digests of the request: about 5 % of the gateway's CPU per request); false: lines without them, which "
        "a replay prices again on their recorded tier and decides nothing of")
    tenants: tuple[Tenant, ...] = ()
    removes: tuple[str, ...] = Field(
        default=(), description="what this version drops from the serving one, as a refused reload names it "
        "(tenants[NAME], tenants[NAME].FIELD, FIELD): a reload that loses a tenant or a set field is refused unless "
        "listed here (a file cut short); gateway.config.removals")

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
