"""`gateway experiments promote NAME ARM --policy FILE`: the policy edit that makes an arm the default.

The arm's fields (routing, default_tier, tier_map, max_tokens) are written where the experiment is
defined (the top level or the tenant), replacing the ones there, and the experiment is removed.
Promoting the control arm only removes the experiment: the rollback. The file is edited as text at
the YAML nodes' positions, so comments and layout elsewhere survive; the new values are written in
flow style (`routing: {classifier: ..., bands: [...]}`). The result is validated before it is shown.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import yaml

from gateway.config.policies import Arm, Experiment, Limits, PolicyConfig, Routing


class PromoteError(Exception):
    """The experiment or arm is not in the file, or the edit would not be a valid policy."""


@dataclass(frozen=True, slots=True)
class Promotion:
    text: str  # the new policy file
    scope: str  # "the top level" or "tenant NAME"
    fields: tuple[str, ...]  # the fields written
    notes: tuple[str, ...]  # what the edit does not carry over exactly


def promote(text: str, experiment: str, arm: str, tenant: str | None = None) -> Promotion:
    try:
        policy = PolicyConfig.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValueError) as err:
        raise PromoteError(f"the policy file is not valid: {err}") from None
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    assert isinstance(root, yaml.MappingNode)
    scopes: list[tuple[str, Limits, yaml.MappingNode]] = [("the top level", policy, root)]
    tenant_nodes = _child(root, "tenants")
    items = tenant_nodes.value if isinstance(tenant_nodes, yaml.SequenceNode) else []
    scopes += [(f"tenant {t.name}", t, item) for t, item in zip(policy.tenants, items)]
    found = [(name, limits, node) for name, limits, node in scopes
             if any(e.name == experiment for e in limits.experiments or ())
             and (tenant is None or name == f"tenant {tenant}")]
    if not found:
        where = f" of tenant {tenant!r}" if tenant else ""
        raise PromoteError(f"no experiment {experiment!r} in the policy{where}")
    if len(found) > 1:
        raise PromoteError(f"experiment {experiment!r} is defined in {', '.join(f[0] for f in found)}: "
                           "name one with --tenant")
    scope, limits, node = found[0]
    chosen = next(e for e in limits.experiments or () if e.name == experiment)
    picked = _inherit_classifier(_arm(chosen, arm), limits.routing or policy.routing)
    new = _edit(text, node, chosen, picked)
    _check(new, scope, picked, tenant_index=None if scope == "the top level" else scopes.index(found[0]) - 1)
    return Promotion(new, scope, picked.overrides(), _notes(policy, limits, picked))


def unified_diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))


def _arm(experiment: Experiment, name: str) -> Arm:
    arm = next((a for a in experiment.arms if a.name == name), None)
    if arm is not None:
        return arm
    if name == experiment.control_arm:  # the implicit control
        return Arm(name=name, share=1.0, control=True)
    names = [a.name for a in experiment.arms] + ([experiment.control_arm] if experiment.covers_all else [])
    raise PromoteError(f"experiment {experiment.name!r} has no arm {name!r} (arms: {', '.join(dict.fromkeys(names))})")


def _inherit_classifier(arm: Arm, base: Routing | None) -> Arm:
    """Bands without a classifier of their own read the scope's during the experiment (`config.tenants.apply_arm`):
    the promoted bands name it, so promotion does not change the classifier."""
    if arm.routing is None or base is None or "classifier" in arm.routing.model_fields_set:
        return arm
    return arm.model_copy(update={"routing": arm.routing.model_copy(update={"classifier": base.classifier})})


def _edit(text: str, scope: yaml.MappingNode, experiment: Experiment, arm: Arm) -> str:
    """Write the arm's fields into `scope` and take the experiment out, as text edits applied back to front."""
    edits: list[tuple[int, int, str]] = []
    key, runs = _entry(scope, "experiments")
    assert key is not None and isinstance(runs, yaml.SequenceNode)
    indent = " " * key.start_mark.column
    added: list[str] = []
    for name in arm.overrides():
        value = _flow(_plain(getattr(arm, name)))
        field_key, existing = _entry(scope, name)
        if field_key is None or existing is None:
            added.append(f"{name}: {value}")
        else:  # from the key's end: a block value's comment on the key's line goes with the old value
            edits.append((field_key.end_mark.index, _end(existing), f": {value}"))
    others = [item for item in runs.value if _scalar(_child(item, "name")) != experiment.name]
    if not others:  # the fields take the `experiments:` entry's place
        replacement = f"\n{indent}".join(added) if added else None
        if replacement is None:
            edits.append((_line_start(text, key.start_mark.index), _line_end(text, _end(runs)), ""))
        else:
            edits.append((key.start_mark.index, _end(runs), replacement))
    else:
        if added:
            edits.append((key.start_mark.index, key.start_mark.index, "".join(f"{a}\n{indent}" for a in added)))
        if runs.flow_style:
            kept = [yaml.safe_load(yaml.serialize(item)) for item in others]
            edits.append((runs.start_mark.index, _end(runs), _flow(kept)))
        else:
            item = next(i for i in runs.value if _scalar(_child(i, "name")) == experiment.name)
            edits.append((_line_start(text, item.start_mark.index), _line_end(text, _end(item)), ""))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _check(text: str, scope: str, arm: Arm, tenant_index: int | None) -> None:
    try:
        policy = PolicyConfig.model_validate(yaml.safe_load(text))
    except (yaml.YAMLError, ValueError) as err:  # a bug here, not the user's
        raise PromoteError(f"the edited policy would not be valid ({err}); please edit the file by hand") from None
    limits: Limits = policy if tenant_index is None else policy.tenants[tenant_index]
    for name in arm.overrides():
        if getattr(limits, name) != getattr(arm, name):
            raise PromoteError(f"the edit did not set {name} in {scope}; please edit the file by hand")


def _notes(policy: PolicyConfig, scope: Limits, arm: Arm) -> tuple[str, ...]:
    if scope is not policy:
        return ()
    notes = []
    for tenant in policy.tenants:
        own = [name for name in arm.overrides() if getattr(tenant, name) is not None]
        if tenant.experiments is None and own:
            notes.append(f"tenant {tenant.name} sets its own {', '.join(own)}, which the arm replaced during the "
                         "experiment and which it keeps after this change")
    return tuple(notes)


def _plain(value: Any) -> Any:
    """A policy value as plain YAML data (the file's own spelling: aliases, no unset fields)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)
    return value


def _flow(value: Any) -> str:
    dumped = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=1 << 20).strip()
    return dumped[1:-1]


def _entry(node: yaml.Node, key: str) -> tuple[yaml.Node | None, yaml.Node | None]:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if getattr(k, "value", None) == key:
                return k, v
    return None, None


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    return _entry(node, key)[1]


def _scalar(node: yaml.Node | None) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) else None


def _end(node: yaml.Node) -> int:
    """Where the node's own text ends (a block collection's end mark lies past trailing comments)."""
    if isinstance(node, yaml.MappingNode) and not node.flow_style and node.value:
        return _end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and not node.flow_style and node.value:
        return _end(node.value[-1])
    return int(node.end_mark.index)


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _line_end(text: str, index: int) -> int:
    end = text.find("\n", index)
    return len(text) if end < 0 else end + 1
