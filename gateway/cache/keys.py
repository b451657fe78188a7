"""What makes two requests the same answer: the exact-cache key and the rule for caching at all."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gateway.config.policies import CacheRule

# Fields that do not change the answer: left out of the key.
OUTPUT_NEUTRAL = frozenset({"model", "stream", "stream_options", "user", "metadata", "store", "service_tier"})
# Requests whose answers one stored text cannot replay faithfully.
UNCACHEABLE = ("tools", "functions", "logprobs", "top_logprobs", "echo", "suffix", "best_of")


def cacheable(body: dict[str, Any], rule: CacheRule) -> bool:
    """Deterministic requests (temperature 0 or a seed), or any request in mode 'always'."""
    if not rule.enabled or any(body.get(name) for name in UNCACHEABLE) or body.get("n", 1) != 1:
        return False
    return rule.mode == "always" or body.get("temperature") == 0 or isinstance(body.get("seed"), int)


def scope_of(tenant: str, rule: CacheRule) -> str:
    """Whose answers a key may serve: the tenant's own, unless the policy shares the cache."""
    return "*shared*" if rule.shared else tenant


def response_key(scope: str, tier: str, endpoint: str, body: dict[str, Any]) -> str:
    """resp:<sha256 of scope, tier, endpoint and every output-changing field, keys sorted>."""
    fields = {name: value for name, value in body.items() if name not in OUTPUT_NEUTRAL}
    canonical = orjson.dumps([scope, tier, endpoint, fields], option=orjson.OPT_SORT_KEYS)
    return "resp:" + hashlib.sha256(canonical).hexdigest()


PROMPT_FIELDS = frozenset({"messages", "prompt"})


def semantic_namespace(scope: str, tier: str, endpoint: str, body: dict[str, Any]) -> str:
    """Paraphrases may share an answer only within one scope, tier and set of output-changing parameters."""
    fields = {n: v for n, v in body.items() if n not in OUTPUT_NEUTRAL and n not in PROMPT_FIELDS}
    canonical = orjson.dumps([scope, tier, endpoint, fields], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()[:32]
