"""`gateway policy check`: the server's own validation over files given on the command line.

Routes files (a top-level `tiers` key) are checked alone. A policy file is checked with a routes file
by `load_config`, the function the server runs at start and on every reload, so the check passes
exactly the pairs the server accepts. Its routes file: `--routes`, else the routes file of the same
name among the paths, else the only routes file among them, else `routes/<its name>` beside its folder
(the repository's layout). Without one, or beside an invalid one, the policy's own rules still run, and the
check fails as the server would (exit 1), saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from gateway.config import ConfigError, ConfigIssue, check_policy_alone, load_config
from gateway.config.loader import load_policy
from gateway.config.removals import check_removals
from gateway.config.tokenizers import check_routes_file

CROSS_FILE = ("baseline_tier", "default_tier", "allowed_tiers", "routing.bands[].tier", "tier_map",
              "experiments[].arms[] tiers", "shadow tiers")


@dataclass(frozen=True, slots=True)
class Checked:
    """One file's result: its issues, the routes file a policy was checked with, or why it was not."""

    path: Path
    issues: tuple[ConfigIssue, ...]
    routes: Path | None = None
    skipped: str | None = None  # why the cross-file checks did not run

    def lines(self) -> list[str]:
        if self.issues:
            tail = [f"{self.path}: cross-file checks skipped: {self.skipped}"] if self.skipped else []
            return [str(issue) for issue in self.issues] + tail
        if self.routes is not None:
            return [f"{self.path}: ok (with {self.routes})"]
        if self.skipped is not None:
            return [f"{self.path}: not servable: {self.skipped}; the server loads a policy only with a valid routes "
                    f"file (the tiers named in {', '.join(CROSS_FILE)} are checked against it)"]
        return [f"{self.path}: ok"]

    @property
    def ok(self) -> bool:
        """The server would accept it: no issues, and a policy's pair was checked whole (a policy without a
        valid routes file is not servable, whatever its own rules say)."""
        return not self.issues and self.skipped is None


def is_routes_file(path: Path) -> bool:
    """A routes file has a top-level `tiers` key (an unreadable file is not one: its check says why)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return False
    return isinstance(data, dict) and "tiers" in data


def check_paths(paths: Sequence[Path], routes: Path | None = None, previous: Path | None = None) -> list[Checked]:
    """Every file checked; each policy with its routes file (see the module docstring), and against `previous`
    (the policy serving now) as a reload compares them (`gateway.config.removals`)."""
    if routes is not None and routes not in paths:
        paths = [routes, *paths]
    kinds = {path: is_routes_file(path) for path in paths}
    given = [path for path, is_routes in kinds.items() if is_routes]
    results = []
    for path in paths:
        if kinds[path]:
            results.append(Checked(path, tuple(check_routes_file(path))))
        else:
            results.append(_against(check_policy(path, routes or routes_for(path, given)), previous))
    return results


def _against(checked: Checked, previous: Path | None) -> Checked:
    """`checked` (a policy) compared with `previous`, the policy serving now, as a reload compares them."""
    if previous is None or checked.issues:
        return checked
    try:
        check_removals(load_policy(previous), load_policy(checked.path), checked.path)
    except ConfigError as err:
        return replace(checked, issues=err.issues)
    return checked


def routes_for(policy: Path, given: Sequence[Path]) -> Path | None:
    """The routes file a policy pairs with when none is named with --routes."""
    same_name = [path for path in given if path.name == policy.name]
    if same_name:
        return same_name[0]
    if len(given) == 1:
        return given[0]
    beside = policy.resolve().parent.parent / "routes" / policy.name
    return beside if not given and beside.is_file() else None


def check_policy(policy: Path, routes: Path | None) -> Checked:
    """The policy alone, then (its routes file valid) the pair as the server loads it."""
    try:
        check_policy_alone(policy)
    except ConfigError as err:
        skipped = None if routes is None else f"{policy} has errors of its own"
        return Checked(policy, err.issues, skipped=skipped or "no routes file: pass --routes FILE")
    if routes is None:
        return Checked(policy, (), skipped="no routes file of its name among the paths or in routes/ beside its "
                       "folder: pass --routes FILE")
    if check_routes_file(routes):
        return Checked(policy, (), skipped=f"its routes file {routes} is invalid")
    try:
        load_config(routes, policy)
    except ConfigError as err:
        return Checked(policy, err.issues, routes)
    return Checked(policy, (), routes)
