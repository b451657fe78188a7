"""Config: routes and policy files compiled into one frozen `GatewayConfig`."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gateway.config.loader import ConfigError, ConfigIssue, check_file, load_policy, load_routes
from gateway.config.policies import MaxTokens, PolicyConfig, Tenant
from gateway.config.routes import Replica, RoutesConfig, Tier

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "GatewayConfig",
    "MaxTokens",
    "PolicyConfig",
    "Replica",
    "RoutesConfig",
    "Tenant",
    "Tier",
    "check_file",
    "load_config",
]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    routes: RoutesConfig
    policy: PolicyConfig
    tiers: Mapping[str, Tier]
    tenants_by_key_hash: Mapping[str, Tenant]
    version: str
    loaded_at: float

    @classmethod
    def build(cls, routes: RoutesConfig, policy: PolicyConfig, version: str = "inline") -> GatewayConfig:
        """Cross-check a routes and a policy config and index them for the request path."""
        tiers = {t.name: t for t in routes.tiers}
        if policy.default_tier not in tiers:
            raise ConfigError(
                [ConfigIssue("policy", None, "default_tier", repr(policy.default_tier),
                             f"no such tier in routes (have {', '.join(tiers)})")]
            )
        bands = policy.routing.bands if policy.routing else ()
        for i, band in enumerate(bands):
            if band.tier not in tiers:
                raise ConfigError([ConfigIssue("policy", None, f"routing.bands[{i}].tier", repr(band.tier),
                                               f"no such tier in routes (have {', '.join(tiers)})")])
        by_hash = {t.api_key_sha256: t for t in policy.tenants}
        return cls(routes, policy, tiers, by_hash, version, time.time())


def load_config(routes_path: str | Path, policy_path: str | Path) -> GatewayConfig:
    routes, policy = load_routes(routes_path), load_policy(policy_path)
    digest = hashlib.sha256(Path(routes_path).read_bytes() + Path(policy_path).read_bytes())
    try:
        return GatewayConfig.build(routes, policy, digest.hexdigest()[:12])
    except ConfigError as err:
        issue = err.issues[0]
        raise ConfigError([ConfigIssue(str(policy_path), None, issue.field, issue.value, issue.reason)]) from None
