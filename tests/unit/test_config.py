import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, check_file, load_config
from gateway.config.loader import load_policy, load_routes

ROOT = Path(__file__).resolve().parents[2]
GOOD_POLICY = f"""
default_tier: small
max_tokens: {{default: 16, maximum: 64}}
tenants:
  - name: a
    api_key_sha256: {hashlib.sha256(b'k').hexdigest()}
"""
GOOD_ROUTES = """
tiers:
  - name: small
    precision: int4
    context_window: 4096
    prices: {input_per_mtok: 0.1, output_per_mtok: 0.2}
    replicas:
      - {name: s1, url: "http://127.0.0.1:9000/v1", model: m}
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_examples_are_valid() -> None:
    for path in [*ROOT.glob("routes/*.yaml"), *ROOT.glob("policies/*.yaml")]:
        assert check_file(path) == [], path


def test_good_files_compile_to_a_frozen_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "r.yaml", GOOD_ROUTES), write(tmp_path, "p.yaml", GOOD_POLICY))
    assert config.tiers["small"].replicas[0].port == 9000
    assert config.tenants_by_key_hash[hashlib.sha256(b"k").hexdigest()].name == "a"
    with pytest.raises(Exception):
        config.policy.max_tokens.default = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "field", "line", "reason"),
    [
        (GOOD_ROUTES.replace("int4", "int3"), "tiers[0].precision", 4, "'int4'"),
        (GOOD_ROUTES.replace('"http://127.0.0.1:9000/v1"', "ftp://x"), "tiers[0].replicas[0].url", 8, "http(s)"),
        (GOOD_ROUTES.replace("context_window: 4096", "context_window: -1"), "tiers[0].context_window", 5, "greater"),
        (GOOD_ROUTES.replace("model: m", "modle: m"), "tiers[0].replicas[0].modle", 8, "Extra inputs"),
        (GOOD_ROUTES + GOOD_ROUTES.split("tiers:\n")[1], "tiers", 3, "duplicate tier"),
    ],
)
def test_route_errors_name_file_line_field_and_value(tmp_path: Path, text: str, field: str, line: int,
                                                     reason: str) -> None:
    path = write(tmp_path, "routes.yaml", text)
    with pytest.raises(ConfigError) as caught:
        load_routes(path)
    issue = next(i for i in caught.value.issues if i.field == field)
    assert (issue.file, issue.line) == (str(path), line)
    assert reason in issue.reason
    assert str(path) in str(issue) and field in str(issue)


def test_policy_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "p.yaml", GOOD_POLICY.replace("default: 16", "default: 100"))
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert caught.value.issues[0].field == "max_tokens"
    assert "must not exceed maximum" in caught.value.issues[0].reason


def test_unknown_default_tier_is_refused_naming_the_policy_file(tmp_path: Path) -> None:
    routes = write(tmp_path, "r.yaml", GOOD_ROUTES)
    policy = write(tmp_path, "p.yaml", GOOD_POLICY.replace("default_tier: small", "default_tier: huge"))
    with pytest.raises(ConfigError) as caught:
        load_config(routes, policy)
    assert str(policy) in str(caught.value) and "default_tier" in str(caught.value)


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    broken = write(tmp_path, "b.yaml", "tiers: [\n  - {name: x\n")
    issues = check_file(broken)
    assert issues and "invalid YAML" in issues[0].reason and issues[0].line
    assert "No such file" in check_file(tmp_path / "missing.yaml")[0].reason


def test_policy_check_cli_exit_codes(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", GOOD_POLICY)
    bad = write(tmp_path, "bad.yaml", GOOD_POLICY.replace("api_key_sha256: ", "api_key_sha256: zz"))
    routes = write(tmp_path, "routes.yaml", GOOD_ROUTES)
    run = [sys.executable, "-m", "gateway", "policy", "check"]
    ok = subprocess.run([*run, "--routes", str(routes), str(good)], capture_output=True, text=True)
    assert ok.returncode == 0 and "ok" in ok.stdout
    alone = subprocess.run([*run, str(good)], capture_output=True, text=True)  # the server would refuse it: no routes
    assert alone.returncode == 1
    failed = subprocess.run([*run, "--routes", str(routes), str(good), str(bad)], capture_output=True, text=True)
    assert failed.returncode == 1
    assert f"{bad}:6: tenants[0].api_key_sha256" in failed.stdout
