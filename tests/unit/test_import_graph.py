"""The package's import graph has no circles: not at run time (module-level or in a function), and not
through annotations (`if TYPE_CHECKING:` blocks) either; the serving classifier imports no training code."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every gateway module and the gateway modules it imports (a name imported from a package counts as
    its submodule when there is one, else as the package)."""
    modules = {module_name(p): p for p in GATEWAY.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                found = owner(target)
                if found is not None and found != name and not name.startswith(found + "."):
                    edges.add(found)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_the_detector_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_in_a_circle() -> None:
    assert circles(import_graph()) == []


def test_the_serving_classifier_reaches_no_training_code() -> None:
    graph = import_graph()
    serving = [m for m in graph if m.startswith("gateway.classifier")]
    assert serving
    for module in serving:
        assert not {m for m in reachable(graph, module) if m.startswith("gateway.training")}, module


def test_backends_know_nothing_of_the_request_context() -> None:
    graph = import_graph()
    for module in (m for m in graph if m.startswith("gateway.backends")):
        assert "gateway.context" not in graph[module], module
