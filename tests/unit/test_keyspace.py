"""Issue 37: the registry of every Redis key family and in-process cache (gateway.keyspace), walked: two tenants'
keys differ in every tenant family (built by the real key functions), they meet only where the family is
shareable and both policies share the cache; every Redis key prefix in the package is registered; the names of
the gateway's own scopes are refused as tenant names by the loader and by `gateway policy check`."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from gateway.cache.keys import SHARED_SCOPE
from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.embedder import OFFLINE_SCOPE, CachedEmbedder
from gateway.config import ConfigError, PolicyConfig
from gateway.config.check import check_paths
from gateway.config.loader import load_policy
from gateway.config.policies import CacheRule, Limits, reserved_reason
from gateway.config.tenants import ANONYMOUS, TenantPolicy, resolve
from gateway.keyspace import FAMILIES, INTERNAL_SCOPES, OFFLINE, tenant_scope
from tests.unit.test_classifier_head_serving import FakeEncoder
from tests.unit.test_policy_check import run_check, write

ROOT = Path(__file__).resolve().parents[2]
POLICY = PolicyConfig.model_validate({"default_tier": "t"})
# string literals ending in ':' in the package that are not Redis key prefixes (messages, YAML, CSS, SSE)
NOT_KEYS = {"band", "blank", "cost", "create_app", "data", "deterministic", "did", "error", "event", "experiment",
            "false", "folder", "font", "gateway", "gguf", "held", "llamacpp", "none", "quality", "round_robin",
            "routes", "saved", "slots", "supported", "tab", "vllm",
            "spilled",  # a route reason: "spilled: <tier> over its TTFT SLO; ..." (gateway/routing/spill_decision.py)
            "window",  # a line of the what-if report: "window: <sampled>" (gateway/whatif/report.py)
            "host",  # 'host:port' in a docstring (gateway/cache/nodes.py)
            "streams"}  # a field's description: "streams: hold the first K tokens, ..." (gateway/config/policies.py)


def tenant(name: str, shared: bool = False) -> TenantPolicy:
    return resolve(name, Limits(cache=CacheRule(shared=shared)), POLICY)


def test_every_family_is_registered_with_a_scope_and_tenant_families_with_their_key_function() -> None:
    names = [family.name for family in FAMILIES]
    assert len(set(names)) == len(names)
    for family in FAMILIES:
        assert family.scope in ("tenant", "request", "gateway") and family.where in ("redis", "process", "backend")
        assert (family.keys_of is not None) == (family.scope == "tenant"), family.name
    assert {"response cache", "semantic index", "embedding cache", "embedding LRU", "remote embedding vectors",
            "prefix affinity", "backend prefix cache", "rate limits and budgets", "sessions", "feedback", "shadow pairs"} <= set(names)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.scope == "tenant"], ids=lambda f: f.name)
def test_two_tenants_keys_differ_unless_the_policy_shares_the_family(family: object) -> None:
    from gateway.keyspace import Family

    assert isinstance(family, Family) and family.keys_of is not None
    alice, bob = family.keys_of(tenant("alice")), family.keys_of(tenant("bob"))
    assert alice and bob and not set(alice) & set(bob), family.name
    assert family.keys_of(tenant("alice")) == alice  # deterministic: the same tenant finds its own keys
    shared_alice, shared_bob = family.keys_of(tenant("alice", True)), family.keys_of(tenant("bob", True))
    if family.shareable:
        assert shared_alice == shared_bob  # one shared scope: what the policy asked for
        assert not set(shared_alice) & set(alice)  # and apart from a tenant's own
    else:
        assert not set(shared_alice) & set(shared_bob)  # limits, sessions, feedback, pairs: never shared


def test_every_redis_key_prefix_in_the_package_is_a_registered_family() -> None:
    literal = re.compile(r"""(?<![\w.])f?b?["']([a-z_]{1,16}):(?!//)""")
    skip = {"bench", "emulator", "testing", "training", "local"}
    prefixes = {match[1] for path in (ROOT / "gateway").rglob("*.py") if not skip & set(path.parts)
                for match in literal.finditer(path.read_text(encoding="utf-8"))}
    patterns = " ".join(family.pattern for family in FAMILIES)
    unregistered = {p for p in prefixes - NOT_KEYS if not re.search(rf"(?<![a-z_]){p}:", patterns)}
    assert not unregistered, f"key prefixes without a gateway.keyspace family: {sorted(unregistered)}"


def test_the_scopes_are_the_tenant_name_or_the_shared_one() -> None:
    assert tenant_scope(tenant("alice")) == "alice" and tenant_scope(tenant("alice", True)) == SHARED_SCOPE
    assert OFFLINE == OFFLINE_SCOPE and set(INTERNAL_SCOPES) == {ANONYMOUS, SHARED_SCOPE, OFFLINE}


async def test_the_embedder_encodes_one_text_once_per_tenant_scope() -> None:
    encoder = FakeEncoder()
    embedder = CachedEmbedder(MicroBatcher(encoder, window_s=0.001), namespace="ns")
    text = "the quarterly numbers before they are published"
    (a,), encoded_a = await embedder.embed_many([text], scope="alice")
    (again,), encoded_again = await embedder.embed_many([text], scope="alice")
    (b,), encoded_b = await embedder.embed_many([text], scope="bob")
    assert (encoded_a, encoded_again, encoded_b) == (1, 0, 1)  # bob's identical text is his own miss
    assert np.array_equal(a, b) and encoder.texts == [text, text]
    embedder.close()


@pytest.mark.parametrize("name", [*INTERNAL_SCOPES, "Anonymous", "a*b", "*", "team{1}", "x}"])
def test_reserved_names_are_refused_with_the_reason(name: str) -> None:
    assert reserved_reason(name) is not None
    with pytest.raises(ValidationError) as refused:
        PolicyConfig.model_validate({"default_tier": "t", "tenants": [
            {"name": name, "api_key_sha256": "0" * 64}]})
    assert refused.value.errors()[0]["loc"] == ("tenants", 0, "name")


@pytest.mark.parametrize("name", ["alice", "team-batch", "demo", "anonymous-2", "a.b_c"])
def test_ordinary_names_pass(name: str) -> None:
    assert reserved_reason(name) is None


def policy_named(name: str) -> str:
    return (f"default_tier: small\ntenants:\n  - name: ok\n    api_key_sha256: {hashlib.sha256(b'a').hexdigest()}\n"
            f"  - name: '{name}'\n    api_key_sha256: {hashlib.sha256(b'b').hexdigest()}\n")


@pytest.mark.parametrize("name", ["anonymous", "*shared*"])
def test_the_server_loader_and_policy_check_name_file_field_and_reason(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / "policies", "p.yaml", policy_named(name))
    with pytest.raises(ConfigError) as refused:
        load_policy(path)
    (issue,) = refused.value.issues
    assert (issue.file, issue.line, issue.field) == (str(path), 5, "tenants[1].name")
    assert "reserved" in issue.reason
    (checked,) = check_paths([path])
    assert [str(i) for i in checked.issues] == [str(issue)]
    result = run_check(path)
    assert result.returncode != 0 and f"{path}:5: tenants[1].name:" in result.stdout + result.stderr
    assert "reserved" in result.stdout + result.stderr
