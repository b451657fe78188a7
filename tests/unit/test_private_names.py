"""No module imports another module's private names (issue 38): `from gateway.x import _name` and
`gateway.x._name` reach into what its owner may change without notice. A name one module shares with
others is public (no leading underscore); dunders are not private."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def reaches(source: str) -> list[str]:
    """Each private name `source` imports from, or reads off, another gateway module."""
    tree = ast.parse(source)
    modules: set[str] = set()  # local names bound to gateway modules (import gateway.x as y; from gateway import x)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gateway":
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                elif node.module == "gateway" or alias.name.islower():
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gateway":
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and ast.unparse(node.value) in modules:
            found.append(f"{ast.unparse(node.value)}.{node.attr}")
    return found


def test_the_detector_finds_both_shapes() -> None:
    assert reaches("from gateway.sse import DONE, _data_of\nfrom gateway import sse\nsse._x()\nx._y") == [
        "gateway.sse._data_of", "sse._x"]
    assert reaches("from gateway.sse import DONE\nclass A:\n    def __init__(self): self._x = 1") == []


def test_no_module_imports_another_modules_private_names() -> None:
    offenders = {str(path.relative_to(GATEWAY.parent)): names for path in sorted(GATEWAY.rglob("*.py"))
                 if (names := reaches(path.read_text(encoding="utf-8")))}
    assert offenders == {}
