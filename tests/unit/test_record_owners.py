"""Each record on the request's context has one owner (issue 38): only the owner's modules assign its fields.

`ctx.route` (gateway.routing.decision.RouteDecision) is written by the route's steps, `ctx.upstream`
(gateway.upstream.record.UpstreamRecord) by the hop to a replica, `ctx.result` (gateway.accounting.result.RequestResult)
by the edge (status, outcome, error as the client saw them) and the account stage (the price); a field with another
single writer names it below. Anyone else goes through a method of the record (defined beside it). The
check is by syntax: an assignment (plain, augmented, or in a tuple) to `<anything>.<record>.<field>`, or a
`setattr(<anything>.<record>, ...)`, outside the field's owner fails; so does an owner map that names a field
the record does not have."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from gateway.accounting.result import RequestResult
from gateway.routing.decision import RouteDecision
from gateway.upstream.record import UpstreamRecord

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"

# record attribute on RequestContext -> (its class, its owner, {field: that field's own owner})
RECORDS: dict[str, tuple[type, str, dict[str, str]]] = {
    "route": (RouteDecision, "gateway.routing", {
        "difficulty": "gateway.stages.classify", "quality": "gateway.stages.classify",
        "predicted_ttft_s": "gateway.stages.admission", "predicted_on": "gateway.stages.admission"}),
    "upstream": (UpstreamRecord, "gateway.upstream", {"stop_sequence": "gateway.protocols.base"}),
    "result": (RequestResult, "gateway.http gateway.edge.accounted", {  # the edge: its two modules
        "cost_usd": "gateway.stages.account", "priced_from": "gateway.stages.account"}),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def within(module: str, owners: str) -> bool:
    return any(module == owner or module.startswith(owner + ".") for owner in owners.split())


def targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        found = [node.target]
    else:
        return []
    flat: list[ast.expr] = []
    while found:
        target = found.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            found.extend(target.elts)
        else:
            flat.append(target)
    return flat


def writes(source: str) -> list[tuple[str, str, int]]:
    """(record, field or '*' for setattr, line) for each write to a record's field through the context."""
    found = []
    for node in ast.walk(ast.parse(source)):
        for target in targets(node):
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                    and target.value.attr in RECORDS):
                found.append((target.value.attr, target.attr, target.lineno))
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args
                and isinstance(node.args[0], ast.Attribute) and node.args[0].attr in RECORDS):
            found.append((node.args[0].attr, "*", node.lineno))
    return found


def test_the_owner_map_names_only_fields_the_records_have() -> None:
    for record, (cls, _, fields) in RECORDS.items():
        assert set(fields) <= {f.name for f in dataclasses.fields(cls)}, record


def test_only_a_records_owner_assigns_its_fields() -> None:
    wrong = []
    for path in sorted(GATEWAY.rglob("*.py")):
        module = module_name(path)
        for record, field, line in writes(path.read_text()):
            _, owner, fields = RECORDS[record]
            if not within(module, fields.get(field, owner)):
                wrong.append(f"{path.relative_to(GATEWAY.parent)}:{line}: {record}.{field}")
    assert wrong == []


def test_the_check_sees_plain_tuple_augmented_and_setattr_writes() -> None:
    source = "ctx.route.tier = t\na, ctx.route.spill = 1, 2\nctx.route.prefix_tokens += 1\nsetattr(ctx.route, 'x', 1)\n"
    assert writes(source) == [("route", "tier", 1), ("route", "spill", 2), ("route", "prefix_tokens", 3),
                              ("route", "*", 4)]
    assert writes("ctx.route.brownout('small', tier)\nx = ctx.route.tier\n") == []
