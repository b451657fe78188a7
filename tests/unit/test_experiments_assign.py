"""Sticky arm assignment: the split follows the shares, per user and per conversation, and survives reloads."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import pytest

from gateway.config import GatewayConfig
from gateway.config.loader import load_routes
from gateway.config.policies import Arm, MaxTokens, PolicyConfig
from gateway.config.tenants import TenantPolicy
from gateway.experiments.assign import apply_arm, assign as assign_reading, position, salt_of, sticky_key as key_of
from gateway.reading import read

from tests.unit.test_experiments_policy import ROOT

KEY = hashlib.sha256(b"k").hexdigest()
ROUTES = load_routes(ROOT / "routes/emulator.yaml")
USERS = [f"user-{i}" for i in range(10_000)]


def tenant(*experiments: dict[str, Any]) -> TenantPolicy:
    data = {"default_tier": "small-int4", "experiments": list(experiments),
            "tenants": [{"name": "t", "api_key_sha256": KEY}]}
    return GatewayConfig.build(ROUTES, PolicyConfig.model_validate(data)).tenants_by_key_hash[KEY]


def fifty_fifty(name: str = "e", **extra: Any) -> dict[str, Any]:
    return {"name": name, "arms": [{"name": "ctl", "share": 0.5, "control": True},
                                   {"name": "big", "share": 0.5, "default_tier": "large-fp16"}], **extra}


BY_USER = {"sticky_by": "user"}


def chat(user: str | None = None, system: str = "Be brief.", first: str = "hello", turns: int = 0) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": first}]
    for i in range(turns):
        messages += [{"role": "assistant", "content": f"answer {i}"}, {"role": "user", "content": f"more {i}"}]
    body: dict[str, Any] = {"model": "auto", "messages": messages}
    if user is not None:
        body["user"] = user
    return body


def assign(policy: TenantPolicy, body: dict[str, Any]) -> Any:
    """The arm of a body, as the policy stage assigns it: from the body's reading and its `user`."""
    return assign_reading(policy, read("chat" if "messages" in body or "prompt" not in body else "completions", body),
                          body.get("user"))


def sticky_key(body: dict[str, Any], tenant: str = "", by_user: bool = False) -> int | None:
    return key_of(read("completions" if "prompt" in body else "chat", body), tenant,
                  body.get("user") if by_user else None)


def arms_of(policy: TenantPolicy, bodies: list[dict[str, Any]]) -> list[str | None]:
    return [a.arm if (a := assign(policy, body)) else None for body in bodies]


def test_a_fifty_fifty_experiment_splits_10k_users_within_two_percent_and_is_sticky() -> None:
    policy = tenant(fifty_fifty(**BY_USER))
    first = arms_of(policy, [chat(user) for user in USERS])
    counts = Counter(first)
    assert set(counts) == {"ctl", "big"}
    assert abs(counts["big"] / len(USERS) - 0.5) < 0.02, counts
    again = arms_of(policy, [chat(user, first=f"another question {i}", turns=2) for i, user in enumerate(USERS)])
    assert again == first  # the user decides, not the prompt
    big = assign(policy, chat(next(u for u, arm in zip(USERS, first) if arm == "big")))
    assert big is not None and big.policy.default_tier == "large-fp16" and big.header == "e/big"
    assert big.log_fields() == {"experiment": "e", "arm": "big", "arm_control": False}


def test_shares_are_followed_for_uneven_splits_and_the_rest_is_the_implicit_control() -> None:
    policy = tenant({"name": "e", "arms": [{"name": "a", "share": 0.1}, {"name": "b", "share": 0.3}], **BY_USER})
    counts = Counter(arms_of(policy, [chat(user) for user in USERS]))
    assert set(counts) == {"a", "b", "control"}
    for arm, share in (("a", 0.1), ("b", 0.3), ("control", 0.6)):
        assert abs(counts[arm] / len(USERS) - share) < 0.02, counts


def test_without_a_user_every_turn_of_a_conversation_stays_in_its_arm() -> None:
    policy = tenant(fifty_fifty())
    starts = [chat(first=f"question {i}") for i in range(2000)]
    first = arms_of(policy, starts)
    later = arms_of(policy, [chat(first=f"question {i}", turns=3) for i in range(2000)])
    assert later == first
    assert abs(Counter(first)["big"] / 2000 - 0.5) < 0.05
    other_system = arms_of(policy, [chat(system="Be verbose.", first=f"question {i}") for i in range(2000)])
    assert other_system != first  # the system prompt is part of the conversation's identity


def test_completion_prompts_and_content_parts_are_keys_and_empty_bodies_are_not_assigned() -> None:
    policy = tenant(fifty_fifty())
    parts = chat(first="")
    parts["messages"][1]["content"] = [{"type": "text", "text": "hello"}]
    assert sticky_key(parts) == sticky_key(chat(first="hello"))
    assert sticky_key({"prompt": "once upon"}) == sticky_key({"prompt": ["once upon", "x"]}) is not None
    assert sticky_key({"prompt": "once upon"}) != sticky_key({"prompt": "a time"})
    assert sticky_key({"user": "u"}, by_user=True) != sticky_key({"prompt": "u"})
    assert assign(policy, {"model": "auto", "messages": []}) is None
    assert assign(policy, {"model": "auto", "user": ""}) is None


def test_a_reload_with_the_same_shares_keeps_every_assignment_and_a_larger_share_only_adds() -> None:
    bodies = [chat(user) for user in USERS]
    before = arms_of(tenant(fifty_fifty(**BY_USER)), bodies)
    edited = fifty_fifty(**BY_USER)
    edited["arms"][1]["default_tier"] = "medium-int8"  # the arm's override changes, its share does not
    assert arms_of(tenant(edited), bodies) == before
    small = {"name": "e", "arms": [{"name": "ctl", "share": 0.1, "control": True}, {"name": "t", "share": 0.1}],
             **BY_USER}
    grown = {"name": "e", "arms": [{"name": "ctl", "share": 0.1, "control": True}, {"name": "t", "share": 0.3}],
             **BY_USER}
    was, now = arms_of(tenant(small), bodies), arms_of(tenant(grown), bodies)
    assert all(n == w for w, n in zip(was, now) if w is not None)  # nobody changes arm
    assert Counter(now)["t"] > Counter(was)["t"] + 1000  # the newcomers come from outside the experiment


def test_experiments_are_exclusive_and_split_independently() -> None:
    first = {"name": "first", "arms": [{"name": "c1", "share": 0.25, "control": True}, {"name": "t1", "share": 0.25}],
             **BY_USER}
    second = {"name": "second", "arms": [{"name": "c2", "share": 0.5, "control": True}, {"name": "t2", "share": 0.5}],
              **BY_USER}
    policy = tenant(first, second)
    got = [assign(policy, chat(user)) for user in USERS]
    counts = Counter(a.arm for a in got if a is not None)
    assert all(a is not None for a in got)  # `second` takes everyone outside `first`
    for arm, share in (("c1", 0.25), ("t1", 0.25), ("c2", 0.25), ("t2", 0.25)):
        assert abs(counts[arm] / len(USERS) - share) < 0.02, counts
    alone = arms_of(tenant(second), [chat(user) for user in USERS])
    outside_first = [arm for a, arm in zip(got, alone) if a is not None and a.experiment == "second"]
    assert outside_first == [a.arm for a in got if a is not None and a.experiment == "second"]  # same hash
    # independence: being in t2 (when alone) says nothing about being in `first`
    in_first = [a is not None and a.experiment == "first" for a in got]
    t2_share_in_first = sum(f for f, arm in zip(in_first, alone) if arm == "t2") / alone.count("t2")
    assert abs(t2_share_in_first - 0.5) < 0.03


def test_positions_are_uniform_and_depend_on_the_experiment_name() -> None:
    keys = [sticky_key({"user": user}, "t", by_user=True) for user in USERS]
    a = [position(salt_of("a"), k) for k in keys if k is not None]
    b = [position(salt_of("b"), k) for k in keys if k is not None]
    assert all(0 <= p < 1 for p in a)
    deciles = Counter(int(p * 10) for p in a)
    assert min(deciles.values()) > 900 and max(deciles.values()) < 1100
    assert sum((x < 0.5) == (y < 0.5) for x, y in zip(a, b)) / len(a) == pytest.approx(0.5, abs=0.03)


def test_apply_arm_replaces_only_the_fields_the_arm_sets() -> None:
    base = tenant(fifty_fifty())
    arm = Arm(name="x", share=0.1, tier_map={"small-int4": "medium-int8"})
    effective = apply_arm(base, arm)
    assert effective.map_tier("small-int4") == "medium-int8"
    assert effective.default_tier == base.default_tier and effective.max_tokens == base.max_tokens
    assert effective.plan is None and base.plan is not None
    assert assign(tenant(), chat("u")) is None  # no experiments: nothing to do



def test_without_sticky_by_user_the_user_field_does_not_pick_the_arm() -> None:
    """Issue 37: a client walked `user` values until it landed in the arm it wanted. By default the key is the
    tenant and the conversation: a thousand `user` values on one conversation are one arm."""
    policy = tenant(fifty_fifty())
    arms = set(arms_of(policy, [chat(user, first="the same question") for user in USERS[:1000]]))
    assert len(arms) == 1
    assert set(arms_of(tenant(fifty_fifty(**BY_USER)), [chat(u, first="the same question") for u in USERS[:1000]])) \
        == {"ctl", "big"}  # where the policy allows it, `user` decides


def test_the_tenant_is_part_of_the_key() -> None:
    bodies = [chat(first=f"question {i}") for i in range(4000)]
    ours = [sticky_key(b, "alice") for b in bodies]
    theirs = [sticky_key(b, "bob") for b in bodies]
    assert all(a != b for a, b in zip(ours, theirs))
    at = [(position(salt_of("e"), a) < 0.5) == (position(salt_of("e"), b) < 0.5)  # type: ignore[arg-type]
          for a, b in zip(ours, theirs)]
    assert sum(at) / len(at) == pytest.approx(0.5, abs=0.04)  # independent splits


@pytest.mark.parametrize(("tenant_cap", "arm_cap", "effective"), [
    # the case: 3,000 granted against the tenant's 128 maximum with on_exceed: reject
    (MaxTokens(default=64, maximum=128, on_exceed="reject"), MaxTokens(default=3000, maximum=3000),
     MaxTokens(default=64, maximum=128, on_exceed="reject")),
    # a stricter arm applies
    (MaxTokens(default=256, maximum=4096), MaxTokens(default=16, maximum=32, on_exceed="reject"),
     MaxTokens(default=16, maximum=32, on_exceed="reject")),
    (MaxTokens(default=100, maximum=1000), MaxTokens(default=500, maximum=600),
     MaxTokens(default=100, maximum=600)),
])
def test_an_arm_never_loosens_the_tenants_max_tokens(tenant_cap: MaxTokens, arm_cap: MaxTokens,
                                                     effective: MaxTokens) -> None:
    import dataclasses

    base = dataclasses.replace(tenant(), max_tokens=tenant_cap)
    assert apply_arm(base, Arm(name="x", share=0.5, max_tokens=arm_cap)).max_tokens == effective


def test_an_arms_policy_keeps_every_cap_of_the_tenant() -> None:
    data = {"default_tier": "small-int4", "tenants": [{
        "name": "t", "api_key_sha256": KEY, "max_tokens": {"default": 64, "maximum": 128, "on_exceed": "reject"},
        "max_prompt_chars": 500, "output_cap": {"tokens": 32, "chars": 200},
        "rate_limit": {"requests_per_min": 10, "tokens_per_min": 3000}, "daily_budget_usd": 1.0,
        "experiments": [{"name": "e", "arms": [
            {"name": "loose", "share": 0.5, "max_tokens": {"default": 3000, "maximum": 3000},
             "default_tier": "large-fp16"}]}]}]}
    base = GatewayConfig.build(ROUTES, PolicyConfig.model_validate(data)).tenants_by_key_hash[KEY]
    assert base.plan is not None
    (loose, _control) = base.plan.experiments[0].arms
    arm = loose.policy
    assert arm.max_tokens == MaxTokens(default=64, maximum=128, on_exceed="reject")
    for name in ("max_prompt_chars", "output_cap", "rate_limit", "daily_budget_usd", "allowed_tiers", "priority",
                 "stop", "cache", "name", "max_prompt_tokens"):
        assert getattr(arm, name) == getattr(base, name), name
    assert arm.default_tier == "large-fp16"


def test_sticky_keys_are_blake2b_of_the_tenant_and_the_conversation_s_start_every_time() -> None:
    """The keys the arms are split on, as documented: by `user`, blake2b-64 of "u", the tenant, NUL and the user;
    by conversation, the first 8 bytes (little-endian) of blake2b-128 of "conversation", NUL, the tenant, NUL and
    the JSON of the message parts through the first user message (the tenant's part hashed once and copied: a
    copy that were not taken would change every later key)."""
    import orjson

    from gateway.experiments.assign import user_key

    def reference(data: bytes, size: int = 8) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=size).digest()[:8], "little")

    later = chat(system="sys", first="hi é", turns=2)  # (a body holds no lone surrogate: orjson refuses them)
    for _ in range(2):  # the second time from the cached seed
        for name in ("alice", "bob", "é\ud800"):
            parts = orjson.dumps([["text", "system", "sys", 0], ["text", "user", "hi é", 1]])
            start = reference(b"conversation\x00" + f"{name}\x00".encode("utf-8", "surrogatepass") + parts, 16)
            assert sticky_key(later, name) == start == sticky_key(chat(system="sys", first="hi é"), name)
            assert user_key(name, "u-1") == reference(b"u" + f"{name}\x00u-1".encode("utf-8", "surrogatepass"))
    assert sticky_key({"model": "auto", "messages": []}, "alice") is None


