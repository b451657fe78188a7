"""`gateway policy check` runs the server's validation: cross-file rules, file and line for every error."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config
from gateway.config.check import check_paths

ROOT = Path(__file__).resolve().parents[2]
ROUTES = """\
tiers:
  - name: small
    precision: int4
    context_window: 4096
    prices: {input_per_mtok: 0.1, output_per_mtok: 0.2}
    replicas:
      - {name: s1, url: "http://127.0.0.1:9000/v1", model: m}
  - name: large
    precision: fp16
    context_window: 4096
    prices: {input_per_mtok: 1, output_per_mtok: 2}
    replicas:
      - {name: l1, url: "http://127.0.0.1:9001/v1", model: m}
"""
POLICY = f"""\
default_tier: small
routing:
  bands:
    - {{below: 0.5, tier: small}}
    - {{tier: large}}
tenants:
  - name: a
    api_key_sha256: {hashlib.sha256(b'k').hexdigest()}
    tier_map: {{large: small}}
"""
BROKEN = {  # a policy each file alone accepts and the server refuses with these routes: (text, field, line)
    "band": (POLICY.replace("tier: large}", "tier: lareg}"), "routing.bands[1].tier", 5),
    "default_tier": (POLICY.replace("default_tier: small", "default_tier: smal"), "default_tier", 1),
    "tier_map": (POLICY.replace("{large: small}", "{large: tiny}"), "tenants[0].tier_map.large", 9),
}


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def run_check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", "policy", "check", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_refuses_what_the_server_refuses_with_file_and_line(tmp_path: Path, case: str) -> None:
    text, field, line = BROKEN[case]
    routes, policy = write(tmp_path, "routes.yaml", ROUTES), write(tmp_path, "policy.yaml", text)
    with pytest.raises(ConfigError) as served:
        load_config(routes, policy)
    [checked_policy] = [r for r in check_paths([routes, policy]) if r.path == policy]
    assert checked_policy.issues == served.value.issues  # one code path: the same issues, word for word
    [issue] = [i for i in served.value.issues if i.field == field]
    assert (issue.file, issue.line) == (str(policy), line) and "no such tier" in issue.reason
    result = run_check(routes, policy)
    assert result.returncode == 1
    assert f"{policy}:{line}: {field}: no such tier in routes" in result.stdout


def test_every_issue_of_a_policy_is_reported_at_once_with_its_line(tmp_path: Path) -> None:
    text = POLICY.replace("tier: large}", "tier: lareg}").replace("default_tier: small", "default_tier: smal")
    routes, policy = write(tmp_path, "routes.yaml", ROUTES), write(tmp_path, "policy.yaml", text)
    result = run_check("--routes", routes, policy)
    assert result.returncode == 1
    assert f"{policy}:1: default_tier" in result.stdout and f"{policy}:5: routing.bands[1].tier" in result.stdout


def test_without_a_routes_file_the_policy_is_not_servable_and_the_check_fails(tmp_path: Path) -> None:
    """Issue 38: the server refuses a policy without a routes file; so does the check (it said ok, exit 0)."""
    policy = write(tmp_path / "elsewhere", "policy.yaml", BROKEN["band"][0])
    result = run_check(policy)
    assert result.returncode == 1
    assert "not servable: no routes file" in result.stdout and "routing.bands[].tier" in result.stdout
    assert "--routes FILE" in result.stdout


def test_beside_an_invalid_routes_file_the_policy_check_fails(tmp_path: Path) -> None:
    """Issue 38: it said "ok on its own" and exit 0 beside a routes file the server refuses."""
    routes = write(tmp_path / "routes", "site.yaml", ROUTES.replace("name: large", "name: 7"))
    policy = write(tmp_path / "policies", "site.yaml", POLICY)
    result = run_check(routes, policy)
    assert result.returncode == 1
    assert f"{policy}: not servable: its routes file {routes} is invalid" in result.stdout


def test_policy_rules_that_need_no_routes_file_still_run(tmp_path: Path) -> None:
    text = POLICY.replace("tier_map: {large: small}", "allowed_tiers: [small]\n    tier_map: {small: large}")
    policy = write(tmp_path, "policy.yaml", text)
    result = run_check(policy)
    assert result.returncode == 1
    assert f"{policy}:10: tenants[0].tier_map.small: tenant 'a' may not use this tier" in result.stdout


def test_a_policy_pairs_with_the_routes_file_of_its_name_or_the_one_beside_it(tmp_path: Path) -> None:
    routes = write(tmp_path / "routes", "site.yaml", ROUTES)
    other = write(tmp_path / "routes", "other.yaml", ROUTES.replace("name: large", "name: huge"))
    policy = write(tmp_path / "policies", "site.yaml", POLICY)
    named = run_check(other, routes, policy)
    assert named.returncode == 0 and f"{policy}: ok (with {routes})" in named.stdout
    beside = run_check(policy)  # routes/site.yaml next to policies/: the repository's layout
    assert beside.returncode == 0 and f"(with {routes.resolve()})" in beside.stdout
    against_other = run_check("--routes", other, policy)
    assert against_other.returncode == 1 and "'large'" in against_other.stdout


def test_the_repository_files_pass_as_the_readme_runs_them() -> None:
    paired = [ROOT / "policies" / f"{path.stem}.yaml" for path in sorted(ROOT.glob("routes/*.yaml"))]
    result = run_check(*sorted(ROOT.glob("routes/*.yaml")), *[path for path in paired if path.is_file()])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "policies/local.yaml: ok (with " in result.stdout and "routes/local.yaml)" in result.stdout
    example = run_check("--routes", "routes/emulator.yaml", "policies/example.yaml", "policies/experiments-example.yaml")
    assert example.returncode == 0 and example.stdout.count("ok (with routes/emulator.yaml)") == 2
    readme = (ROOT / "README.md").read_text()  # the commands above, as the README shows them
    assert "gateway policy check routes/*.yaml policies/local.yaml policies/emulator.yaml " in readme
    assert ("gateway policy check --routes routes/emulator.yaml policies/example.yaml "
            "policies/experiments-example.yaml\n") in readme
    assert "policy check routes/*.yaml policies/*.yaml   " not in readme  # exits 1: example.yaml has no pair


@pytest.mark.parametrize(("tokenizer", "reason"), [
    ("gguf:gemma-9000", "unknown local model 'gemma-9000'"), ("gguf:gemma3-270m-f16:chatml", "unknown chat format"),
    ("tokenizers/missing.json", "no tokenizer.json file there"),
])
def test_a_tokenizer_the_server_could_not_load_is_refused_at_load_and_by_the_check(
        tmp_path: Path, tokenizer: str, reason: str) -> None:
    routes = write(tmp_path, "routes.yaml", ROUTES.replace("    precision: fp16\n",
                                                           f"    precision: fp16\n    tokenizer: {tokenizer}\n"))
    policy = write(tmp_path, "policy.yaml", POLICY)
    with pytest.raises(ConfigError) as served:
        load_config(routes, policy)
    [issue] = served.value.issues
    assert (issue.file, issue.line, issue.field) == (str(routes), 10, "tiers[1].tokenizer") and reason in issue.reason
    result = run_check(routes, policy)
    assert result.returncode == 1 and f"{routes}:10: tiers[1].tokenizer: " in result.stdout


def test_the_tokenizers_the_repository_uses_pass() -> None:
    from gateway.config.loader import load_routes

    for path in ROOT.glob("routes/*.yaml"):
        load_routes(path)
