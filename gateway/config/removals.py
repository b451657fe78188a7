"""A policy reload may not lose a tenant, or anything a tenant or the top level sets, without saying so.

A policy file cut short at a line boundary (a half-written save the watcher caught, a truncated copy) is still
valid YAML: the tenants after the cut are gone, or the last tenant keeps its name and key and loses its budget
and limits, and would be served unlimited. So a reload compares the new policy with the one serving: a tenant
(by name) or an explicitly set field (at the top level or in a tenant, nested fields too: `rate_limit.
tokens_per_min`) that the serving version has and the new one lacks is refused, unless the new file's top-level
`removes:` names it, spelled as the refusal prints it:

    removes:
      - tenants[bob]                      # bob leaves (all of bob)
      - tenants[alice].daily_budget_usd   # alice's budget is lifted
      - rate_limit                        # the top-level rate limit goes (with its fields)

Changing a value is not a loss (a cut drops lines, it does not rewrite them), nor is shortening a list (fewer
allowed tiers is stricter). `removes:` only acknowledges: a name there that the file still has is kept. Delete
the list once the new version serves: left in place it would acknowledge the same losses on a later reload.
The server has no serving version at start: run `gateway policy check --previous SERVING NEW` before a
restart (and in CI), which makes this same comparison.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from gateway.config.loader import ConfigError, ConfigIssue, field_line
from gateway.config.policies import PolicyConfig

NOT_COMPARED = frozenset({"tenants", "removes"})  # tenants compared by name; `removes` is the acknowledgment


def losses(serving: PolicyConfig, new: PolicyConfig) -> list[tuple[str, str]]:
    """(name as `removes:` spells it, the new file's field to place it at) for each loss not acknowledged."""
    found = _lost_fields(serving, new, "", "")
    positions = {tenant.name: index for index, tenant in enumerate(new.tenants)}
    for tenant in serving.tenants:
        if tenant.name not in positions:
            found.append((f"tenants[{tenant.name}]", "tenants"))
            continue
        index = positions[tenant.name]
        found += _lost_fields(tenant, new.tenants[index], f"tenants[{tenant.name}].", f"tenants[{index}].")
    acknowledged = set(new.removes)
    return [(name, place) for name, place in found if not _covered(name, acknowledged)]


def check_removals(serving: PolicyConfig, new: PolicyConfig, policy_path: str | Path) -> None:
    """Raise a ConfigError (file, line, field, reason) for every loss `removes:` does not name."""
    lost = losses(serving, new)
    if lost:
        reason = ("the serving policy sets this and the new file does not: a file cut short? If the removal is "
                  "meant, list it under the top-level `removes:` (see docs/OPERATIONS.md, policy removals)")
        raise ConfigError([ConfigIssue(str(policy_path), field_line(policy_path, place), name, "absent", reason)
                           for name, place in lost])


def _lost_fields(old: BaseModel, new: BaseModel, name: str, place: str) -> list[tuple[str, str]]:
    lost = []
    for field in sorted(old.model_fields_set - NOT_COMPARED):
        before, after = getattr(old, field), getattr(new, field, None)
        if before is None:
            continue
        if after is None or field not in new.model_fields_set:
            lost.append((f"{name}{field}", place.rstrip(".")))
        elif isinstance(before, BaseModel) and isinstance(after, BaseModel):
            lost += _lost_fields(before, after, f"{name}{field}.", f"{place}{field}.")
    return lost


def _covered(name: str, acknowledged: set[str]) -> bool:
    """`name` or one of its parents (`tenants[a]` covers `tenants[a].rate_limit.tokens_per_min`) is listed."""
    while True:
        if name in acknowledged:
            return True
        cut = name.rfind(".")
        if cut < 0:
            return False
        name = name[:cut]
