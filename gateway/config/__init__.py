"""Config: routes and policy files compiled into one frozen `GatewayConfig`."""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from gateway.config.loader import ConfigError, ConfigIssue, check_file, load_policy, load_routes, locate
from gateway.config.policies import Limits, MaxTokens, PolicyConfig, Spill, Tenant
from gateway.config.routes import Replica, RoutesConfig, Tier
from gateway.config.tenants import TenantPolicy, compile_tenants

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "GatewayConfig",
    "MaxTokens",
    "PolicyConfig",
    "Replica",
    "RoutesConfig",
    "Spill",
    "Tenant",
    "TenantPolicy",
    "Tier",
    "check_file",
    "check_policy_alone",
    "load_config",
]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    routes: RoutesConfig
    policy: PolicyConfig
    tiers: Mapping[str, Tier]
    tenants_by_key_hash: Mapping[str, TenantPolicy]
    anonymous: TenantPolicy | None
    baseline: Tier  # what savings are measured against
    version: str
    loaded_at: float

    @classmethod
    def build(cls, routes: RoutesConfig, policy: PolicyConfig, version: str = "inline") -> GatewayConfig:
        """Cross-check a routes and a policy config and index them for the request path (every issue of the
        policy is reported at once: its tier names, then its tenants' own rules)."""
        tiers = {t.name: t for t in routes.tiers}
        issues = [ConfigIssue("policy", None, field, repr(name), f"no such tier in routes (have {', '.join(tiers)})")
                  for field, name in tier_references(policy) if name not in tiers]
        issues += _quality_issues(routes, policy)
        try:
            by_hash, anonymous = compile_tenants(policy)
        except ConfigError as err:
            raise ConfigError([*issues, *err.issues]) from None
        if issues:
            raise ConfigError(issues)
        baseline = tiers[policy.baseline_tier] if policy.baseline_tier else max(routes.tiers, key=_output_price)
        return cls(routes, policy, MappingProxyType(tiers), MappingProxyType(by_hash), anonymous, baseline, version,
                   time.time())

    def policies(self) -> tuple[TenantPolicy, ...]:
        """Every tenant policy a request may be served under: each tenant's, the anonymous one, and each
        experiment arm's (an arm's policy replaces its tenant's for the requests it is assigned)."""
        tenants = [*self.tenants_by_key_hash.values(), *([self.anonymous] if self.anonymous is not None else [])]
        arms = [arm.policy for tenant in tenants if tenant.plan is not None
                for experiment in tenant.plan.experiments for arm in experiment.arms]
        return (*tenants, *arms)


def _output_price(tier: Tier) -> float:
    """USD for a million output tokens at today's prices: how the default baseline tier is chosen."""
    return tier.price_at(datetime.now(UTC).date()).cost_usd(0, 1_000_000)


def _quality_issues(routes: RoutesConfig, policy: PolicyConfig) -> list[ConfigIssue]:
    """A quality_floor needs tiers to choose among: at least two chat tiers with a quality_model in routes."""
    measured = [t.name for t in routes.tiers if t.endpoint == "chat" and t.quality_model]
    if len(measured) >= 2:
        return []
    scopes: list[tuple[str, Limits]] = [("", policy), *((f"tenants[{i}].", t) for i, t in enumerate(policy.tenants))]
    fields = [(f"{prefix}quality_floor", limits.quality_floor) for prefix, limits in scopes]
    fields += [(f"{prefix}experiments[{i}].arms[{j}].quality_floor", arm.quality_floor) for prefix, limits in scopes
               for i, experiment in enumerate(limits.experiments or ()) for j, arm in enumerate(experiment.arms)]
    have = f"only {measured[0]!r} has one" if measured else "none has one"
    reason = (f"routing by quality needs at least two chat tiers with quality_model in routes ({have}): "
              "name the measured model that stands for each tier")
    return [ConfigIssue("policy", None, field, repr(value), reason)
            for field, value in fields if value is not None and value is not False]


def tier_references(policy: PolicyConfig) -> list[tuple[str, str]]:
    """(field, tier name) for every tier a policy names, at the top level and in each tenant."""
    refs: list[tuple[str, str]] = [("baseline_tier", policy.baseline_tier)] if policy.baseline_tier else []
    for prefix, limits in [("", policy), *((f"tenants[{i}].", t) for i, t in enumerate(policy.tenants))]:
        if limits.default_tier:
            refs.append((f"{prefix}default_tier", limits.default_tier))
        refs += [(f"{prefix}allowed_tiers[{j}]", name) for j, name in enumerate(limits.allowed_tiers or ())]
        bands = limits.routing.bands if limits.routing else ()
        refs += [(f"{prefix}routing.bands[{j}].tier", band.tier) for j, band in enumerate(bands)]
        refs += limits.experiment_tier_references(prefix)
    return refs


def load_config(routes_path: str | Path, policy_path: str | Path) -> GatewayConfig:
    """What the server runs at start and on every reload (and `gateway policy check` with a routes file): each
    file validated alone, then the policy against the routes; every issue names file, line, field and value."""
    routes, policy = load_routes(routes_path), load_policy(policy_path)
    digest = hashlib.sha256(Path(routes_path).read_bytes() + Path(policy_path).read_bytes())
    try:
        return GatewayConfig.build(routes, policy, digest.hexdigest()[:12])
    except ConfigError as err:
        raise locate(err, policy_path) from None


def check_policy_alone(policy_path: str | Path) -> None:
    """The policy's own rules, those `GatewayConfig.build` checks that need no routes file (tenants' allowed
    tiers against their tier maps and arms, one classifier); raises a located ConfigError."""
    policy = load_policy(policy_path)
    try:
        compile_tenants(policy)
    except ConfigError as err:
        raise locate(err, policy_path) from None
