"""Config files for the throw-away gateways of a benchmark: emulator tiers, tenants by API key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any


def routes_yaml(tiers: Mapping[str, Sequence[tuple[str, str]]], redis_op_timeout_ms: float | None = None,
                quality_models: Mapping[str, str] | None = None) -> str:
    """A routes file: tier name -> [(replica name, base URL)], every tier int4-priced, emulator tokenizer;
    `quality_models`: tier name -> the measured model a policy's quality_floor predicts for it."""
    lines = ["upstream: {connect_timeout_s: 2, read_timeout_s: 30, max_attempts: 2}"]
    if redis_op_timeout_ms is not None:
        lines.append(f"redis: {{op_timeout_ms: {redis_op_timeout_ms}}}")
    lines.append("tiers:")
    measured = quality_models or {}
    for name, replicas in tiers.items():
        lines += [f"  - name: {name}", "    precision: int4", "    context_window: 1048576",
                  "    prices: {input_per_mtok: 0.05, output_per_mtok: 0.20}", "    tokenizer: emulator",
                  *([f"    quality_model: {measured[name]}"] if name in measured else []),
                  "    replicas:"]
        lines += [f'      - {{name: {r}, url: "{url}", model: emulated}}' for r, url in replicas]
    return "\n".join(lines) + "\n"


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy_yaml(default_tier: str, tenants: Sequence[Mapping[str, Any]], max_tokens: int = 16, **top: Any) -> str:
    """A policy file (JSON is YAML): the defaults and any other top-level fields `top` gives, then the tenants
    as given (`key` turned into its hash)."""
    listed: list[dict[str, Any]] = []
    for tenant in tenants:
        t = dict(tenant)
        t["api_key_sha256"] = key_sha256(t.pop("key"))
        listed.append(t)
    body = {"default_tier": default_tier, "allow_anonymous": False,
            "max_tokens": {"default": max_tokens, "maximum": 4096}, **top, "tenants": listed}
    return json.dumps(body, indent=1) + "\n"
