"""Every Redis key family and in-process cache of the gateway, each with whose data it holds (issue 37).

A tenant's data is kept under its *scope*: its own name, or SHARED_SCOPE when its policy shares the cache
(`cache.shared: true`, the response cache's rule, gateway.cache.keys.scope_of); no other tenant's key can be
built from another scope. Families are one of:

    tenant     keys built from the tenant's scope (or, for limits, budgets, sessions, feedback and shadow
               pairs, from the tenant's name alone: those are never shared)
    request    keys named by a request id (128 random bits, gateway.edge.request_ids); what they hold names the
               owner, and every reader checks it (feedback's ownership lookup)
    gateway    hold no tenant data (the replicas' heartbeats)

Tenant names the scopes use internally are reserved (gateway.config.policies.reserved_reason): the policy
loader and `gateway policy check` refuse a tenant named `anonymous` (the scope of requests without a key), any
name holding `*` (the shared scope `*shared*`, the offline scope `*offline*`), `{` or `}` (Redis Cluster hash
tags), naming the file, the field and why.

`FAMILIES` is the registry; tests/unit/test_keyspace.py walks it: for every tenant family, two tenants' keys
built by the real key functions differ, and they are equal only where the family is shareable and both
policies share it. A new Redis key family or in-process cache belongs here (and in docs/SECURITY.md's "What
tenants share").
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gateway.cache.keys import SHARED_SCOPE, scope_of
from gateway.config.tenants import ANONYMOUS, TenantPolicy

Scope = Literal["tenant", "request", "gateway"]
Where = Literal["redis", "process", "backend"]  # backend: a cache of the model server's, keyed by what we send
OFFLINE = "*offline*"  # gateway.classifier.embedder.OFFLINE_SCOPE: benches, training, route tools
INTERNAL_SCOPES = (ANONYMOUS, SHARED_SCOPE, OFFLINE)  # each refused as a tenant name by the policy loader


def tenant_scope(tenant: TenantPolicy) -> str:
    """The scope of a tenant's cached data: its name, or SHARED_SCOPE when its policy shares the cache."""
    return scope_of(tenant.name, tenant.cache)


def cache_salt(tenant: TenantPolicy | None) -> str:
    """vLLM's per-request `cache_salt` for a tenant (replicas with `prefix_cache_salt`): a digest of its scope
    (requests without a tenant: the anonymous scope), so the backend's prefix cache reuses a prefix only within
    one scope. Set by the gateway over any the client sent: a tenant cannot name another scope's salt."""
    scope = tenant_scope(tenant) if tenant is not None else ANONYMOUS
    return hashlib.sha256(f"gateway-cache-salt:{len(scope)}:{scope}".encode("utf-8", "surrogatepass")).hexdigest()[:32]


KeyOf = Callable[[TenantPolicy], list[str]]  # the keys (or in-process cache keys) a tenant's sample request uses


@dataclass(frozen=True, slots=True)
class Family:
    """One Redis key family or in-process cache: its key pattern, where it lives, whose data it holds."""

    name: str
    where: Where
    pattern: str
    scope: Scope
    holds: str
    shareable: bool = False  # True: tenants whose policies share the cache (cache.shared) share these keys
    keys_of: KeyOf | None = None  # the real key function over a sample request (tenant families)


SAMPLE_TEXT = "What is the capital of France? " * 8  # long enough for several prefix blocks
SAMPLE_BODY = {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": SAMPLE_TEXT}]}


def _response(tenant: TenantPolicy) -> list[str]:
    from gateway.cache.keys import response_key
    from gateway.reading import read

    return [response_key(tenant_scope(tenant), "tier", read("chat", SAMPLE_BODY))]


def _semantic(tenant: TenantPolicy) -> list[str]:
    from gateway.cache.keys import semantic_namespace
    from gateway.cache.semantic import index_key
    from gateway.reading import read

    return [index_key(semantic_namespace(tenant_scope(tenant), "tier", read("chat", SAMPLE_BODY)))]


def _embedding(tenant: TenantPolicy) -> list[str]:
    from gateway.cache.embeddings import store_key
    from gateway.classifier.embedding_cache import scoped_key

    return [store_key(f"encoder-namespace:{scoped_key(tenant_scope(tenant), SAMPLE_TEXT)}")]


def _lru(tenant: TenantPolicy) -> list[str]:
    from gateway.classifier.embedding_cache import scoped_key

    return [scoped_key(tenant_scope(tenant), SAMPLE_TEXT)]


def _vectors(tenant: TenantPolicy) -> list[str]:
    from gateway.cache.embeddings import store_key, vector_key

    return [store_key(vector_key(tenant_scope(tenant), "model", 8, SAMPLE_TEXT))]


def _prefix(tenant: TenantPolicy) -> list[str]:
    from gateway.cache.prefix import prefix_keys

    return prefix_keys(tenant_scope(tenant), "tier", SAMPLE_TEXT)


def _backend_salt(tenant: TenantPolicy) -> list[str]:
    return [cache_salt(tenant)]


def _limits(tenant: TenantPolicy) -> list[str]:
    from gateway.limits.limiter import local_key, rate_key, spend_key

    return [rate_key(tenant, "req", 0), rate_key(tenant, "tok", 0), spend_key(tenant, "2025-01-01"),
            local_key(tenant, "req")]


def _sessions(tenant: TenantPolicy) -> list[str]:
    from gateway.routing.sessions import redis_key, session_id

    session = session_id(tenant.name, "conversation-1", SAMPLE_BODY)
    assert session is not None
    return [redis_key(session), session]  # Redis, and the in-process map's key


def _feedback(tenant: TenantPolicy) -> list[str]:
    from gateway.experiments.feedback import store_keys

    return list(store_keys(tenant.name))


def _shadow(tenant: TenantPolicy) -> list[str]:
    from gateway.experiments.shadow import pair_key

    return [pair_key(tenant.name)]


FAMILIES: tuple[Family, ...] = (
    Family("response cache", "redis", "resp:<sha256(scope, tier, reading)>", "tenant",
           "whole answers", shareable=True, keys_of=_response),
    Family("semantic index", "redis", "sem:{<sha256(scope, tier, reading but the text)>}", "tenant",
           "prompt embeddings pointing at response-cache keys", shareable=True, keys_of=_semantic),
    Family("embedding cache", "redis", "emb:<encoder namespace>:<sha256(scope, text)>", "tenant",
           "sentence/classifier embeddings of prompts and /v1/embeddings inputs", shareable=True,
           keys_of=_embedding),
    Family("embedding LRU", "process", "<sha256(scope, text)> (CachedEmbedder.cache, classifier cascade answers)",
           "tenant", "embeddings and difficulty scores of recent texts", shareable=True, keys_of=_lru),
    Family("remote embedding vectors", "redis", "emb:v:<sha256(scope, model, dimensions, text)>", "tenant",
           "remote embedding tiers' vectors (and the in-flight single-flight map by the same key)",
           shareable=True, keys_of=_vectors),
    Family("prefix affinity", "redis", "pfx:{<tier>}:<hash chain seeded by sha256(scope)>", "tenant",
           "which replica last served a prompt prefix", shareable=True, keys_of=_prefix),
    Family("backend prefix cache", "backend", "vLLM's prefix cache: blocks keyed by the prompt and cache_salt = "
           "sha256(scope) (replicas with prefix_cache_salt; without it the backend shares prefixes between all)",
           "tenant", "KV blocks of prompt prefixes (a reused prefix answers faster)", shareable=True,
           keys_of=_backend_salt),
    Family("rate limits and budgets", "redis", "rl:{<tenant>}:<kind>:<window>, rl:{<tenant>}:usd:<day>; "
           "in process <tenant>:<kind>", "tenant", "request, token and spend counters", keys_of=_limits),
    Family("sessions", "redis", "sess:<blake2b(tenant, conversation)>; in process the same id", "tenant",
           "the tier a conversation holds", keys_of=_sessions),
    Family("feedback", "redis", "feedback:{<tenant>}:by_id, feedback:{<tenant>}:order, fbrate:{<tenant>}:<window>",
           "tenant", "scores and comments on answers, feedback rate counters", keys_of=_feedback),
    Family("shadow pairs", "redis", "shadow:<tenant>", "tenant", "prompts and both tiers' answers",
           keys_of=_shadow),
    Family("request owners", "redis", "reqowner:<5-minute bucket> hash: <request id> -> owner; in process by id",
           "request", "which tenant (and experiment arm) a request id belongs to, checked on every lookup"),
    Family("tokenizer memo", "process", "<text>, popped by the same request's encode", "request",
           "token ids handed from the cascade to the encoder for one request"),
    Family("gateway replicas", "redis", "gw:replicas", "gateway", "random ids of live gateway processes"),
)
