"""Sticky assignment of a request to an experiment's arm, and the arm's effective TenantPolicy.

The key is the tenant with the request's conversation: its start, the messages through the first user message
(`gateway.conversation.start_key`: the same for every turn of a conversation), so every turn of a conversation
lands in the same arm. Only an experiment whose policy says `sticky_by: user` keys on the request's `user` field
instead (the conversation when it has none): the client then chooses its arm by the `user` it sends, which the
policy has allowed. Without it, `user` plays no part, so a client cannot walk `user` values to land in the arm
it wants (issue 37). Whatever the arm, it never loosens the tenant's caps (`config.tenants.apply_arm`). The key
is 64 bits of a blake2b with the tenant's name in it; per experiment, the splitmix64
finalizer of (key hash XOR a 64-bit salt derived from the experiment's name) maps it to a position in
[0, 1), so experiments split independently of each other at one integer mix each (a keyed blake2b per
experiment costs ~1.5 µs more). The arms own consecutive slices of [0, 1) in file order (cumulative
shares). A reload that keeps an experiment's name, arm order and shares keeps every assignment; raising
the last arm's share moves into it only requests from the slice after it (outside the experiment, or
the implicit control). Experiments are independent
(each its own hash) and exclusive: a request joins the first experiment, in file order, whose arms
cover its position, so a later experiment's arms stay comparable with each other.

Everything per arm is compiled when the policy loads (`compile_plan` and `apply_arm`, in `config.tenants`
beside TenantPolicy, re-exported here): the request path pays for the key's hash, one integer mix per
experiment and a bisect (bench/experiments_assign.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from functools import lru_cache
from hashlib import blake2b
from typing import Any

from gateway.config.tenants import Assignment, ExperimentPlan, TenantPolicy, apply_arm, compile_plan, salt_of
from gateway.conversation import start_key
from gateway.reading import Reading

__all__ = ["Assignment", "ExperimentPlan", "apply_arm", "assign", "compile_plan", "position", "salt_of", "sticky_key",
           "conversation_texts", "user_key"]

KEY_CHARS = 1024  # of a `user` (and of the system prompt and the first message: a session's id, routing.sessions)
_SCALE = 1.0 / 2**64
_MASK = 2**64 - 1
_SYSTEM_ROLES = ("system", "developer")


def assign(policy: TenantPolicy, reading: Reading, user: Any = None) -> Assignment | None:
    """The request's arm, or None: the tenant runs no experiment, the request falls outside every arm,
    or it carries nothing to be sticky on (no message, nor a `user` where the experiment keys on it)."""
    plan = policy.plan
    if plan is None:
        return None
    keys: dict[bool, int | None] = {}
    for experiment in plan.experiments:
        by_user = experiment.sticky_by == "user"
        key = keys[by_user] if by_user in keys else keys.setdefault(
            by_user, sticky_key(reading, policy.name, user if by_user else None))
        if key is None:
            continue
        at = position(experiment.salt, key)
        index = bisect.bisect_right(experiment.cuts, at)
        if index < len(experiment.arms):
            return experiment.arms[index]
    return None


def position(salt: int, key: int) -> float:
    """The key's place in [0, 1) for the experiment salted by `salt` (splitmix64's finalizer)."""
    x = key ^ salt
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) * _SCALE


def sticky_key(reading: Reading, tenant: str = "", user: Any = None) -> int | None:
    """A 64-bit key of the tenant and `user` when it is a non-empty string (an experiment with `sticky_by:
    user`), else of the conversation's start (`gateway.conversation.start_key`); None without either."""
    if type(user) is str and user:
        return user_key(tenant, user)
    return start_key(tenant, reading.parts)


def user_key(tenant: str, user: str) -> int:
    """`sticky_key` by a `user` field."""
    return _hash64(b"u", tenant, user[:KEY_CHARS])


def _hash64(kind: bytes, tenant: str, text: str) -> int:
    """blake2b-64 of `kind`, the tenant, NUL and `text` (UTF-8, lone surrogates passed), little-endian; the
    tenant's part hashed once per (kind, tenant) and copied."""
    digest = _seed64(kind, tenant).copy()
    digest.update(text.encode("utf-8", "surrogatepass"))
    return int.from_bytes(digest.digest(), "little")


@lru_cache(maxsize=4096)
def _seed64(kind: bytes, tenant: str) -> Any:
    return blake2b(kind + f"{tenant}\x00".encode("utf-8", "surrogatepass"), digest_size=8)


def conversation_texts(body: Mapping[str, Any]) -> tuple[str, str]:
    """(system prompt, first user message) of a chat body; ("", prompt) for a completion or embedding."""
    messages = body.get("messages")
    if type(messages) is not list:
        prompt = body.get("prompt", body.get("input"))
        if type(prompt) is list:
            prompt = prompt[0] if prompt else ""
        return "", prompt if type(prompt) is str else ""
    system = first = ""
    for message in messages:
        if type(message) is not dict:
            continue
        role = message.get("role")
        if role in _SYSTEM_ROLES and not system:
            content = message.get("content")
            system = content if type(content) is str else _text(content)
        elif role == "user":
            content = message.get("content")
            first = content if type(content) is str else _text(content)
            break
    return system, first


def _text(content: Any) -> str:
    if type(content) is str:
        return content
    if type(content) is list:
        return "\n".join(p["text"] for p in content if type(p) is dict and type(p.get("text")) is str)
    return ""
