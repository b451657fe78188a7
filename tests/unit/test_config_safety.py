"""Config that cannot be turned against the gateway (issue 37): secrets in replica URLs never printed, a
tokenizer that does not load refused by `policy check` as by the server, a policy that loses tenants or limits
refused unless its `removes:` says so, and client strings bounded in log lines."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.accounting.log import MAX_FIELD_CHARS, bounded
from gateway.backends.h1 import Origin
from gateway.backends.urls import redact_url, redact_urls_in
from gateway.config import ConfigError, load_config
from gateway.config.check import check_paths
from gateway.config.loader import check_file, load_policy
from gateway.config.removals import check_removals, losses

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("hunter2", "SECRETTOKEN", "sigvalue")
LEAKY = "http://admin:hunter2@127.0.0.1:9000/v1?token=SECRETTOKEN&api-version=2024-10-21&sig=sigvalue"


def routes(url: str = "http://127.0.0.1:9000/v1", tokenizer: str | None = None, name: str = "s1") -> str:
    extra = f"\n    tokenizer: {tokenizer}" if tokenizer else ""
    return f"""\
tiers:
  - name: small
    precision: int4
    context_window: 4096
    prices: {{input_per_mtok: 0.1, output_per_mtok: 0.2}}{extra}
    replicas:
      - {{name: "{name}", url: "{url}", model: m}}
"""


def key(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


POLICY = f"""\
default_tier: small
rate_limit: {{requests_per_min: 100}}
tenants:
  - name: alice
    api_key_sha256: {key("alice")}
    daily_budget_usd: 5
    rate_limit:
      requests_per_min: 10
      tokens_per_min: 1000
    max_tokens: {{default: 16, maximum: 64}}
  - name: bob
    api_key_sha256: {key("bob")}
    daily_budget_usd: 1
"""


def write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


def no_secret(text: str) -> bool:
    return not any(secret in text for secret in SECRETS)


# -- secrets in URLs --------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    (LEAKY, "http://***@127.0.0.1:9000/v1?token=***&api-version=2024-10-21&sig=***"),
    ("https://h/v1", "https://h/v1"),
    ("http://h:99999/v1?key=a b", "http://h:99999/v1?key=***"),  # a port out of range, a space: still redacted
    ("http://u@h/v1#frag", "http://***@h/v1#***"),
    ("http://h/v1?justasecret", "http://h/v1?***"),
    ("http://[::1/v1?token=x", "http://[::1/v1?token=***"),  # urlsplit refuses this one
])
def test_redact_url_hides_userinfo_and_query_values(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_urls_in(f"backend said: '{url}' ") == f"backend said: '{shown}' "


def test_a_replica_url_that_does_not_parse_is_reported_without_its_secrets(tmp_path: Path) -> None:
    bad = LEAKY.replace(":9000", ":99999")  # refused by the routes schema, quoted in the issue
    issues = check_file(write(tmp_path, "routes.yaml", routes(bad)))
    assert issues and all(no_secret(str(issue)) for issue in issues)
    assert any("***@127.0.0.1:99999" in issue.value for issue in issues)


def test_a_replica_missing_its_model_is_reported_without_its_url_secrets(tmp_path: Path) -> None:
    text = routes(LEAKY).replace(", model: m", "")  # the whole replica mapping is the issue's value
    issues = check_file(write(tmp_path, "routes.yaml", text))
    assert issues and all(no_secret(str(issue)) for issue in issues)


def test_a_replica_name_holding_credentials_is_refused(tmp_path: Path) -> None:
    issues = check_file(write(tmp_path, "routes.yaml", routes(name=LEAKY)))
    assert issues[0].field == "tiers[0].replicas[0].name" and "must not hold a URL's credentials" in issues[0].reason
    assert all(no_secret(str(issue)) for issue in issues)


def test_the_upstream_client_refuses_a_url_without_quoting_its_secrets() -> None:
    with pytest.raises(ValueError) as raised:
        Origin.of(LEAKY.replace("SECRETTOKEN", "SECRET TOKEN").replace("TOKEN", "TOKEN\u00e9"))
    assert "***@127.0.0.1" in str(raised.value) and "SECRET" not in str(raised.value)
    with pytest.raises(ValueError) as raised:
        Origin.of(LEAKY.replace("http://", "ftp://"))
    assert no_secret(str(raised.value))


# -- tokenizers built at validation ------------------------------------------------------------------------------

def test_policy_check_refuses_a_tokenizer_that_does_not_load(tmp_path: Path) -> None:
    junk = write(tmp_path, "tokenizer.json", '{"not": "a tokenizer"}')
    routes_file = write(tmp_path, "routes.yaml", routes(tokenizer=str(junk)))
    policy_file = write(tmp_path, "policy.yaml", POLICY)
    load_config(routes_file, policy_file)  # the schema alone accepts it: the file is there
    results = check_paths([routes_file, policy_file])
    (issue,) = results[0].issues
    assert (issue.file, issue.line, issue.field) == (str(routes_file), 6, "tiers[0].tokenizer")
    assert "does not load" in issue.reason and str(junk) in issue.value
    assert results[1].skipped is not None and "invalid" in results[1].skipped
    printed = subprocess.run([sys.executable, "-m", "gateway", "policy", "check", str(routes_file)],
                             capture_output=True, text=True, cwd=ROOT)
    assert printed.returncode == 1 and f"{routes_file}:6: tiers[0].tokenizer" in printed.stdout


# -- a policy that loses tenants or limits ------------------------------------------------------------------------

def cut(text: str, lines: int) -> str:
    """`text` as a copy cut after its first `lines` lines."""
    return "".join(text.splitlines(keepends=True)[:lines])


@pytest.mark.parametrize(("lines", "lost"), [
    (10, ["tenants[bob]"]),  # bob's three lines gone
    (12, ["tenants[bob].daily_budget_usd"]),  # bob's budget gone
    (8, ["tenants[alice].max_tokens", "tenants[alice].rate_limit.tokens_per_min", "tenants[bob]"]),
])
def test_a_cut_policy_loses_what_the_serving_one_has(tmp_path: Path, lines: int, lost: list[str]) -> None:
    old = load_policy(write(tmp_path, "old.yaml", POLICY))
    new_file = write(tmp_path, "new.yaml", cut(POLICY, lines))
    new = load_policy(new_file)
    assert [name for name, _ in losses(old, new)] == lost
    with pytest.raises(ConfigError) as raised:
        check_removals(old, new, new_file)
    assert [issue.field for issue in raised.value.issues] == lost
    assert all(issue.file == str(new_file) and "removes" in issue.reason for issue in raised.value.issues)


def test_removes_acknowledges_a_loss_and_a_tenant_covers_its_fields(tmp_path: Path) -> None:
    old = load_policy(write(tmp_path, "old.yaml", POLICY))
    said = cut(POLICY, 8) + "removes:\n  - tenants[bob]\n  - tenants[alice].max_tokens\n  - tenants[alice].rate_limit\n"
    check_removals(old, load_policy(write(tmp_path, "new.yaml", said)), tmp_path / "new.yaml")
    partly = cut(POLICY, 8) + 'removes: ["tenants[bob]"]\n'
    assert [name for name, _ in losses(old, load_policy(write(tmp_path, "new.yaml", partly)))] == [
        "tenants[alice].max_tokens", "tenants[alice].rate_limit.tokens_per_min"]


def test_changed_values_and_new_tenants_are_no_loss(tmp_path: Path) -> None:
    old = load_policy(write(tmp_path, "old.yaml", POLICY))
    changed = POLICY.replace("daily_budget_usd: 5", "daily_budget_usd: 50") + (
        f"  - name: carol\n    api_key_sha256: {key('carol')}\n")
    assert losses(old, load_policy(write(tmp_path, "new.yaml", changed))) == []


def test_policy_check_with_previous_says_what_a_reload_says(tmp_path: Path) -> None:
    routes_file = write(tmp_path, "routes.yaml", routes())
    old = write(tmp_path, "serving.yaml", POLICY)
    new = write(tmp_path, "policy.yaml", cut(POLICY, 12))
    printed = subprocess.run([sys.executable, "-m", "gateway", "policy", "check", "--routes", str(routes_file),
                              "--previous", str(old), str(new)], capture_output=True, text=True, cwd=ROOT)
    assert printed.returncode == 1
    assert f"{new}:11: tenants[bob].daily_budget_usd: the serving policy sets this" in printed.stdout
    new.write_text(cut(POLICY, 12) + "removes:\n  - tenants[bob].daily_budget_usd\n")
    assert [r.issues for r in check_paths([new], routes_file, old)] == [(), ()]


# -- log fields bounded ------------------------------------------------------------------------------------------

def test_bounded_cuts_long_strings_with_a_marker() -> None:
    assert bounded(None) is None and bounded("gpt-4o") == "gpt-4o"
    long = "m" * 3_000_000
    shown = bounded(long)
    assert shown is not None and len(shown) < MAX_FIELD_CHARS + 40
    assert shown.startswith("m" * MAX_FIELD_CHARS) and shown.endswith("[cut: 3000000 chars]")
