"""TenantPolicy: a tenant's limits with every default resolved, compiled once when the file loads, with its
experiments' arms compiled too (each arm's effective TenantPolicy; gateway.experiments.assign picks one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.config.policies import (
    IMPLICIT_CONTROL, Arm, CacheRule, Experiment, Limits, MaxTokens, OutputCap, PolicyConfig, Priority, RateLimit,
    Resume, Routing, Sessions, Shadow, Spill, Escalate,
)

if TYPE_CHECKING:
    from gateway.config.loader import ConfigIssue

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
    max_prompt_tokens: int | None
    output_cap: OutputCap | None
    stop: tuple[str, ...]
    priority: Priority
    ttft_slo_ms: float | None
    brownout: bool
    detour: bool  # 'auto' routes around a tier with no healthy replica (gateway.routing.detour)
    rate_limit: RateLimit | None
    daily_budget_usd: float | None
    cache: CacheRule
    routing: Routing | None
    quality_floor: float | None  # model 'auto' by predicted quality (gateway.routing.quality); None: off
    # not hashed (mappings are not hashable): a TenantPolicy stays hashable whatever they hold
    tier_map: Mapping[str, str] = field(default_factory=dict, hash=False)  # the tier chosen -> the tier serving it
    experiments: tuple[Experiment, ...] = field(default=(), hash=False)
    shadow: Shadow | None = None
    plan: ExperimentPlan | None = field(default=None, hash=False)  # compiled: gateway.experiments.assign reads it
    resume: Resume | None = None  # None: resume on, with the defaults (issue 32)
    sessions: Sessions | None = None  # None: no sticky tiers
    spill: Spill | None = None  # None: no spill under load (gateway.routing.spill)
    escalate: Escalate | None = None  # None: answers never escalate (gateway.routing.escalate)

    def allows(self, tier: str) -> bool:
        return self.allowed_tiers is None or tier in self.allowed_tiers

    def map_tier(self, tier: str) -> str:
        """The tier that serves a request routed to `tier` (the tier map applies once)."""
        return self.tier_map.get(tier, tier) if self.tier_map else tier


def resolve(name: str, own: Limits, policy: PolicyConfig) -> TenantPolicy:
    """`own` over the policy's top level over the built-in defaults, field by field; experiments compiled."""
    tenant = _resolve(name, own, policy)
    plan = compile_plan(tenant)
    return tenant if plan is None else dataclasses.replace(tenant, plan=plan)


def _resolve(name: str, own: Limits, policy: PolicyConfig) -> TenantPolicy:
    allowed = _first(own.allowed_tiers, policy.allowed_tiers)
    return TenantPolicy(
        name=name,
        default_tier=_first(own.default_tier, policy.default_tier) or "",
        allowed_tiers=None if allowed is None else frozenset(allowed),
        max_tokens=_first(own.max_tokens, policy.max_tokens) or BUILTIN_MAX_TOKENS,
        max_prompt_chars=_first(own.max_prompt_chars, policy.max_prompt_chars),
        max_prompt_tokens=_first(own.max_prompt_tokens, policy.max_prompt_tokens),
        output_cap=_first(own.output_cap, policy.output_cap),
        stop=_first(own.stop, policy.stop) or (),
        priority=_first(own.priority, policy.priority) or "interactive",
        ttft_slo_ms=_first(own.ttft_slo_ms, policy.ttft_slo_ms),
        brownout=bool(_first(own.brownout, policy.brownout)),
        detour=_first(own.detour, policy.detour) is not False,
        rate_limit=_first(own.rate_limit, policy.rate_limit),
        daily_budget_usd=_first(own.daily_budget_usd, policy.daily_budget_usd),
        cache=_first(own.cache, policy.cache) or CacheRule(),
        routing=_first(own.routing, policy.routing),
        quality_floor=_floor(_first(own.quality_floor, policy.quality_floor)),
        tier_map=MappingProxyType(dict(_first(own.tier_map, policy.tier_map) or {})),
        experiments=_first(own.experiments, policy.experiments) or (),
        shadow=_first(own.shadow, policy.shadow),
        resume=_first(own.resume, policy.resume),
        sessions=_first(own.sessions, policy.sessions),
        spill=_spill(own.spill, policy.spill),
        escalate=_escalate(own.escalate, policy.escalate),
    )


def _first(own: T | None, inherited: T | None) -> T | None:
    return inherited if own is None else own


def _spill(own: Spill | bool | None, inherited: Spill | bool | None) -> Spill | None:
    """A spill rule as the request path reads it: `false` (off, even where the top level sets one) and unset: None."""
    value = inherited if own is None else own
    return value if isinstance(value, Spill) else None


def _escalate(own: Escalate | bool | None, inherited: Escalate | bool | None) -> Escalate | None:
    """An escalate rule as the request path reads it: `false` and unset are both None (off)."""
    value = inherited if own is None else own
    return value if isinstance(value, Escalate) else None


def _floor(value: float | bool | None) -> float | None:
    """A quality_floor as the request path reads it: `false` (off) and unset are both None."""
    return None if value is None or value is False else float(value)


@dataclass(frozen=True, slots=True)
class Assignment:
    """The arm a request belongs to and the tenant policy it is served with."""

    experiment: str
    arm: str
    control: bool
    policy: TenantPolicy  # the tenant's policy with the arm's fields in place; no experiments of its own
    overrides: tuple[str, ...]  # the policy fields the arm replaced

    def log_fields(self) -> dict[str, Any]:
        """Keys for the request log line (and trace attributes)."""
        return {"experiment": self.experiment, "arm": self.arm, "arm_control": self.control}

    @property
    def header(self) -> str:
        """The `x-gateway-arm` response header's value: experiment/arm."""
        return f"{self.experiment}/{self.arm}"


@dataclass(frozen=True, slots=True)
class CompiledExperiment:
    name: str
    salt: int  # 64 bits derived from the name
    sticky_by: str  # "conversation" | "user": what the assignment key reads (gateway.experiments.assign)
    cuts: tuple[float, ...]  # cumulative shares: arm i owns [cuts[i-1], cuts[i])
    arms: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class ExperimentPlan:
    experiments: tuple[CompiledExperiment, ...]


def compile_plan(policy: TenantPolicy) -> ExperimentPlan | None:
    """The tenant's experiments with every arm's effective policy built once (None: no experiments)."""
    if not policy.experiments:
        return None
    base = dataclasses.replace(policy, experiments=(), plan=None)
    compiled = []
    for experiment in policy.experiments:
        arms = list(experiment.arms)
        implicit = not any(arm.control for arm in arms)
        if implicit:  # the rest of the traffic is the implicit control
            arms.append(Arm(name=IMPLICIT_CONTROL, share=max(1e-9, 1.0 - sum(arm.share for arm in arms)),
                            control=True))
        cuts, total = [], 0.0
        for arm in arms:
            total += arm.share
            cuts.append(min(total, 1.0))
        if implicit:
            cuts[-1] = 1.0  # every position, whatever the float sum says
        compiled.append(CompiledExperiment(
            experiment.name, salt_of(experiment.name), experiment.sticky_by, tuple(cuts),
            tuple(Assignment(experiment.name, arm.name, arm.control, apply_arm(base, arm), arm.overrides())
                  for arm in arms),
        ))
    return ExperimentPlan(tuple(compiled))


def salt_of(name: str) -> int:
    return int.from_bytes(blake2b(name.encode(), digest_size=8, person=b"gw-experiment").digest(), "little")


def apply_arm(policy: TenantPolicy, arm: Arm) -> TenantPolicy:
    """`policy` with each field the arm sets replaced by the arm's value (and no experiments of its own).

    An arm never loosens the tenant's caps: its `max_tokens` applies as the stricter of the two (the smaller
    maximum, the smaller default, `reject` when either rejects), and the fields an arm cannot set (output cap,
    prompt caps, rate limits, budget, allowed tiers, priority) are the tenant's; the tiers an arm's
    default_tier and tier_map name must be in the tenant's allowed_tiers (`compile_tenants` refuses others)."""
    changes: dict[str, Any] = {"experiments": (), "plan": None}
    if arm.routing is not None:  # bands without a classifier of their own read the tenant's
        inherit = "classifier" not in arm.routing.model_fields_set and policy.routing is not None
        changes["routing"] = (arm.routing.model_copy(update={"classifier": policy.routing.classifier})
                              if inherit and policy.routing is not None else arm.routing)
    if arm.default_tier is not None:
        changes["default_tier"] = arm.default_tier
    if arm.tier_map is not None:
        changes["tier_map"] = MappingProxyType(dict(arm.tier_map))
    if arm.max_tokens is not None:
        changes["max_tokens"] = stricter_max_tokens(policy.max_tokens, arm.max_tokens)
    if arm.quality_floor is not None:
        changes["quality_floor"] = _floor(arm.quality_floor)
    return dataclasses.replace(policy, **changes)


def stricter_max_tokens(tenant: MaxTokens, arm: MaxTokens) -> MaxTokens:
    """An arm's max_tokens within the tenant's: the smaller maximum and default, `reject` if either rejects."""
    maximum = min(tenant.maximum, arm.maximum)
    on_exceed = "reject" if "reject" in (tenant.on_exceed, arm.on_exceed) else "clamp"
    return MaxTokens(default=min(tenant.default, arm.default, maximum), maximum=maximum, on_exceed=on_exceed)


def compile_tenants(policy: PolicyConfig) -> tuple[Mapping[str, TenantPolicy], TenantPolicy | None]:
    """(tenants by API key hash, the anonymous tenant where the policy allows one). Raises ConfigError when
    a tier map or an experiment's arm sends a tenant to a tier outside its allowed_tiers, or when an arm's
    bands read another classifier than the rest of the policy (the gateway loads one)."""
    by_hash = {t.api_key_sha256: resolve(t.name, t, policy) for t in policy.tenants}
    anonymous = resolve(ANONYMOUS, Limits(), policy) if policy.allow_anonymous else None
    issues = [issue for i, t in enumerate(policy.tenants) for issue in _disallowed(by_hash[t.api_key_sha256], t, i)]
    if anonymous is not None:
        issues += _disallowed(anonymous, Limits(), None)
    owned = [(by_hash[t.api_key_sha256], f"tenants[{i}]." if t.experiments is not None else "")
             for i, t in enumerate(policy.tenants)]
    issues += _other_classifiers(owned + ([(anonymous, "")] if anonymous is not None else []))
    if issues:
        from gateway.config.loader import ConfigError

        raise ConfigError(issues)
    return by_hash, anonymous


def classifier_folders(tenants: Iterable[TenantPolicy]) -> tuple[list[str], list[str]]:
    """(the classifier folders the tenants' own bands read, those only their experiment arms' bands read), sorted."""
    base = {t.routing.classifier for t in tenants if t.routing}
    arms = {a.policy.routing.classifier for t in tenants if t.plan for e in t.plan.experiments for a in e.arms
            if a.policy.routing}
    return sorted(base), sorted(arms - base)


def routes_by_quality(tenants: Iterable[TenantPolicy]) -> bool:
    """Whether a tenant, or one of its experiment arms, routes model 'auto' by predicted quality."""
    return any(t.quality_floor is not None or (t.plan is not None and any(
        a.policy.quality_floor is not None for e in t.plan.experiments for a in e.arms)) for t in tenants)


def _other_classifiers(tenants: Sequence[tuple[TenantPolicy, str]]) -> list[ConfigIssue]:
    """Experiment arms whose bands read a classifier folder other than the policy's: the gateway serves one
    classifier, so such an arm's bands would cut another model's scores."""
    from gateway.config.loader import ConfigIssue

    base, _ = classifier_folders(t for t, _ in tenants)
    expected = base[0] if base else None
    found: dict[tuple[str, str], None] = {}
    for tenant, prefix in tenants:
        for i, experiment in enumerate(tenant.experiments):
            for j, arm in enumerate(experiment.arms):
                routing = apply_arm(tenant, arm).routing if arm.routing is not None else None
                if routing is None:
                    continue
                folder = routing.classifier
                if expected is None:
                    expected = folder
                elif folder != expected:
                    found[(f"{prefix}experiments[{i}].arms[{j}].routing.classifier", folder)] = None
    reason = (f"one classifier per gateway: every band in the policy reads {expected!r}; compare two classifiers "
              "on two gateways (or retrain one and promote it), not in one experiment")
    return [ConfigIssue("policy", None, field_name, repr(folder), reason) for field_name, folder in found]


def _disallowed(tenant: TenantPolicy, own: Limits, index: int | None) -> list[ConfigIssue]:
    """Tiers that the tenant's tier map or experiment arms send it to but its allowed_tiers forbid."""
    from gateway.config.loader import ConfigIssue

    if tenant.allowed_tiers is None:
        return []
    mine = f"tenants[{index}]." if index is not None else ""
    where = {"tier_map": mine if own.tier_map is not None else "",
             "experiments": mine if own.experiments is not None else ""}
    found = [(f"{where['tier_map']}tier_map.{key}", value) for key, value in tenant.tier_map.items()]
    for i, experiment in enumerate(tenant.experiments):
        for j, arm in enumerate(experiment.arms):
            at = f"{where['experiments']}experiments[{i}].arms[{j}]."
            found += [(f"{at}tier_map.{key}", value) for key, value in (arm.tier_map or {}).items()]
            if arm.default_tier is not None:
                found.append((f"{at}default_tier", arm.default_tier))
    allowed = ", ".join(sorted(tenant.allowed_tiers))
    reason = f"tenant {tenant.name!r} may not use this tier (allowed_tiers: {allowed})"
    return [ConfigIssue("policy", None, field_name, repr(tier), reason)
            for field_name, tier in found if tier not in tenant.allowed_tiers]
