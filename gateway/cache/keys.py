"""What makes two requests the same answer: the exact-cache key, the semantic namespace and the rule for
caching at all, each decided from the request's reading (gateway.reading), never from the raw body."""

from __future__ import annotations

import hashlib

import orjson

from gateway.config.policies import CacheRule
from gateway.reading import UNREPLAYABLE, Reading, deterministic

SHARED_SCOPE = "*shared*"


def uncached_reasons(reading: Reading, rule: CacheRule) -> list[str]:
    """Each reason a request's answer is not looked up or stored ([]: it is cacheable). Cached: deterministic
    requests (temperature 0 or an integer seed), or any in mode 'always'; one answer a stored text replays."""
    reasons = []
    if not rule.enabled:
        reasons.append("caching is off for the tenant (cache.enabled: false)")
    if reading.endpoint == "embeddings":
        reasons.append("embeddings are cached per input by the embedding cache, not as answers")
    reasons += [f"the request sets {name!r}, whose answers a stored text cannot replay" for name in UNREPLAYABLE
                if reading.params.get(name)]
    if any(part.role == "tools" for part in reading.parts):
        reasons.append("the request offers tools, whose calls a stored text cannot replay")
    if reading.generated != 1:
        reasons.append(f"it asks for {reading.generated} answers (prompts x n, best_of): only single answers "
                       "(n = 1, one prompt) are cached")
    if rule.mode != "always" and not deterministic(reading.params):
        temperature = reading.params.get("temperature")
        shown = "not set" if temperature is None else f"{temperature!r}"
        reasons.append(f"not deterministic: temperature is {shown} (not 0) and there is no integer seed "
                       "(cache.mode: deterministic caches only those)")
    return reasons


def cacheable(reading: Reading, rule: CacheRule) -> bool:
    """`not uncached_reasons(reading, rule)`, without writing the reasons (the cache stage asks per request)."""
    verdict = reading.cache_class
    return rule.enabled and verdict != "never" and (rule.mode == "always" or verdict == "deterministic")


def scope_of(tenant: str, rule: CacheRule) -> str:
    """Whose answers a key may serve: the tenant's own, unless the policy shares the cache."""
    return SHARED_SCOPE if rule.shared else tenant


def response_key(scope: str, tier: str, reading: Reading) -> str:
    """resp:<sha256 of scope, tier and the whole reading: every input and every output-changing parameter>."""
    canonical = orjson.dumps([scope, tier, reading.key()])
    return "resp:" + hashlib.sha256(canonical).hexdigest()


def semantic_namespace(scope: str, tier: str, reading: Reading) -> str:
    """Paraphrases may share an answer only within one scope, tier, and reading apart from the paraphrased text
    (earlier turns, system, tools, media and parameters all equal)."""
    canonical = orjson.dumps([scope, tier, reading.context_key()])
    return hashlib.sha256(canonical).hexdigest()[:32]
