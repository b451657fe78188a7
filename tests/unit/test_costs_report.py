"""`gateway costs` end to end on a generated log, checked against an independent Decimal computation."""

from __future__ import annotations

import csv
import gzip
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import date
from decimal import Decimal, localcontext
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.accounting.report import run_costs
from gateway.accounting.synth import write_logs

MONEY = ("cost_usd", "avoided_cost_usd", "baseline_cost_usd", "saved_usd")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """3 days: requests.log.2.gz, requests.log.1, requests.log; one malformed line in 997."""
    return write_logs(tmp_path_factory.mktemp("logs"), 6000, days=3, malformed_every=997)


def independent(paths: list[Path]) -> Iterator[dict[str, Any]]:
    """Request lines by the stdlib parser, floats as Decimal straight from the text: no shared code."""
    for path in paths:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            for text in f:
                try:
                    obj = json.loads(text, parse_float=Decimal)
                except ValueError:
                    continue
                if isinstance(obj, dict) and obj.get("event") == "request" and "request_id" in obj:
                    yield obj


def key_of(obj: dict[str, Any], by: list[str]) -> tuple[str, ...]:
    parts = {"tenant": obj["tenant"], "tier": obj["tier"] or "(none)", "day": obj["ts"][:10]}
    return tuple(parts[k] for k in by)


def expected(paths: list[Path], by: list[str]) -> dict[tuple[str, ...], dict[str, Any]]:
    sums: dict[tuple[str, ...], dict[str, Any]] = defaultdict(lambda: defaultdict(Decimal))
    with localcontext(prec=80):
        for obj in independent(paths):
            for key in (key_of(obj, by), ("TOTAL",)):
                s = sums[key]
                s["requests"] += 1
                s["errors"] += not 200 <= obj["status"] < 300
                s["prompt_tokens"] += obj["prompt_tokens"]
                for field in MONEY:
                    s[field] += Decimal(obj.get(field, 0))
                s["cache_savings_usd"] += Decimal(obj.get("avoided_cost_usd", 0))
                if "saved_usd" in obj:
                    s["routing_savings_usd"] += obj["saved_usd"] - obj["avoided_cost_usd"]
                else:
                    s["unpriced_baseline"] += 1
    return sums


def run_csv(tmp_path: Path, logs: list[Path], *extra: str) -> list[dict[str, str]]:
    out = tmp_path / "costs.csv"
    assert run_costs([*map(str, logs), "--csv", str(out), *extra]) == 0
    with open(out, newline="") as f:
        return list(csv.DictReader(f))


def test_totals_reconcile_exactly_with_an_independent_sum(tmp_path: Path, logs: list[Path]) -> None:
    rows = run_csv(tmp_path, logs)
    want = expected(logs, ["tenant", "tier"])
    assert len(rows) == len(want)  # every group plus the total row
    for row in rows:
        key = ("TOTAL",) if row["tenant"] == "TOTAL" else (row["tenant"], row["tier"])
        s = want[key]
        for field in ("cost_usd", "baseline_cost_usd", "saved_usd", "routing_savings_usd", "cache_savings_usd"):
            assert Decimal(row[field]) == s[field], (key, field)
        for field in ("requests", "errors", "prompt_tokens", "unpriced_baseline"):
            assert int(row[field]) == s[field], (key, field)
    groups, total = rows[:-1], rows[-1]
    assert total["tenant"] == "TOTAL" and total["tier"] == ""
    assert sum(Decimal(r["cost_usd"]) for r in groups) == Decimal(total["cost_usd"])
    assert want[("TOTAL",)]["unpriced_baseline"] > 0 and want[("TOTAL",)]["cache_savings_usd"] > 0


def test_csv_header(tmp_path: Path, logs: list[Path]) -> None:
    rows = run_csv(tmp_path, logs, "--by", "day")
    assert list(rows[0]) == [
        "day", "requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd",
        "cost_p50_usd", "cost_p95_usd", "cost_p99_usd", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
        "cache_hits", "routing_savings_usd", "cache_savings_usd", "shadow_cost_usd", "baseline_cost_usd", "saved_usd",
        "unpriced_baseline", "shadow_calls", "spend_usd", "other_endpoint_requests",
    ]  # fmt: skip
    assert "E" not in "".join(r["cost_usd"] for r in rows)  # plain decimals, never 1E-9


@pytest.mark.parametrize("by", ["tenant", "tier", "day", "day,tenant", "tier,day,tenant"])
def test_grouping_by_each_key(tmp_path: Path, logs: list[Path], by: str) -> None:
    keys = by.split(",")
    rows = run_csv(tmp_path, logs, "--by", by)
    want = expected(logs, keys)
    got = {tuple(r[k] for k in keys): r for r in rows[:-1]}
    assert set(got) == set(want) - {("TOTAL",)}
    for key, row in got.items():
        assert int(row["requests"]) == want[key]["requests"]
        assert Decimal(row["cost_usd"]) == want[key]["cost_usd"]
    if keys == ["day"]:
        assert [r["day"] for r in rows] == ["2026-11-19", "2026-11-20", "2026-11-21", "TOTAL"]


def test_percentiles_match_numpy_on_a_group(tmp_path: Path, logs: list[Path]) -> None:
    rows = run_csv(tmp_path, logs, "--by", "tier")
    served = [o for o in independent(logs) if o["tier"] == "medium-int8" and 200 <= o["status"] < 300]
    cost = np.array([float(o["cost_usd"]) for o in served])
    ttft = np.array([float(o["ttft_ms"]) for o in served if o["ttft_ms"] is not None])
    row = next(r for r in rows if r["tier"] == "medium-int8")
    for q, name in ((0.5, "cost_p50_usd"), (0.95, "cost_p95_usd"), (0.99, "cost_p99_usd")):
        assert float(row[name]) == pytest.approx(float(np.quantile(cost, q)), abs=1e-9)
    assert float(row["ttft_p99_ms"]) == pytest.approx(float(np.quantile(ttft, 0.99)), abs=1e-3)


def test_date_filter_through_the_cli(tmp_path: Path, logs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_csv(tmp_path, logs, "--by", "day", "--from", "2026-11-20", "--to", "2026-11-20")
    assert [r["day"] for r in rows] == ["2026-11-20", "TOTAL"]
    assert rows[0]["requests"] == rows[1]["requests"]
    assert "outside the date range: " in capsys.readouterr().out


def test_table_and_skip_counts(logs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert run_costs([str(p) for p in logs]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("tenant"))
    total = next(line for line in lines if line.startswith("TOTAL"))
    assert len(header) == len(total)  # aligned columns
    assert "Malformed lines skipped: 4 (not JSON: 2, missing field: 1, wrong type: 1)" in out
    assert "Text lines skipped (not JSON objects: console output such as a banner, not counted as malformed): 2" in out
    assert "Unpriced baseline" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--by", "tenant,region"], "choose from tenant,tier,day"),
        (["--from", "2026-11-22", "--to", "2026-11-21"], "is after --to"),
        (["--from", "last week"], "not a date"),
    ],
)
def test_bad_arguments(
    logs: list[Path], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run_costs([str(logs[0]), *argv]) == 2
    assert message in capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_costs([str(tmp_path / "nope.log")]) == 2
    assert "not a readable file" in capsys.readouterr().err


def test_plot_is_a_png(tmp_path: Path, logs: list[Path]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "costs.png"
    assert run_costs([*map(str, logs), "--plot", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 300 and height > 200


def test_plot_without_matplotlib_says_so(
    tmp_path: Path, logs: list[Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real: Callable[..., Any] = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert run_costs([str(logs[0]), "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'gateway[train]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_day_keys_are_dates(logs: list[Path]) -> None:
    assert {o["ts"][:10] for o in independent(logs)} == {str(date(2026, 11, d)) for d in (19, 20, 21)}


def test_unwritable_csv_is_reported_not_raised(
    tmp_path: Path, logs: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_costs([str(logs[-1]), "--csv", str(tmp_path / "missing-dir" / "x.csv")]) == 1
    captured = capsys.readouterr()
    assert "cannot write" in captured.err and "TOTAL" in captured.out


def test_tiny_amounts_are_plain_decimals_in_the_csv(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    line = {
        "event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "tier": "small",
        "status": 200, "prompt_tokens": 1, "completion_tokens": 0, "ttft_ms": None, "e2e_ms": 3.0,
        "cache": "miss", "cost_usd": 1e-9, "avoided_cost_usd": 0.0, "baseline_cost_usd": 2e-8, "saved_usd": 1.9e-8,
    }  # fmt: skip
    log.write_text(json.dumps(line) + "\n")
    rows = run_csv(tmp_path, [log])
    assert [r["cost_usd"] for r in rows] == ["0.000000001"] * 2
    assert rows[0]["routing_savings_usd"] == "0.000000019" and rows[0]["ttft_p50_ms"] == ""


def test_grouping_by_session_sums_each_conversation_end_to_end(tmp_path: Path) -> None:
    """Issue 32: a chat's turns on two tiers, one of them resumed, are one row; requests without a session one more."""
    log = tmp_path / "requests.log"
    base = {"event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "status": 200,
            "prompt_tokens": 10, "completion_tokens": 5, "ttft_ms": 1.0, "e2e_ms": 3.0, "cache": "miss"}
    lines = [{**base, "tier": "small", "session": "s1", "cost_usd": 0.001},
             {**base, "tier": "large", "session": "s1", "cost_usd": 0.004, "resumed": True},
             {**base, "tier": "small", "session": "s2", "cost_usd": 0.002},
             {**base, "tier": "small", "cost_usd": 0.0005}]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = {r["session"]: r for r in run_csv(tmp_path, [log], "--by", "session")}
    assert (rows["s1"]["requests"], Decimal(rows["s1"]["cost_usd"])) == ("2", Decimal("0.005"))
    assert (rows["s2"]["requests"], rows["(none)"]["requests"]) == ("1", "1")
    assert Decimal(rows["TOTAL"]["cost_usd"]) == Decimal("0.0075")


def test_shadow_spend_is_in_the_report_on_the_tiers_that_served_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: shadow requests' spend appeared nowhere in `gateway costs`."""
    request = {"event": "request", "ts": "2026-11-21T05:00:00.000+00:00", "tenant": "acme", "tier": "small",
               "status": 200, "prompt_tokens": 10, "completion_tokens": 5, "ttft_ms": 10.0, "e2e_ms": 50.0,
               "cache": "miss", "cost_usd": 0.001}
    shadow = {"event": "shadow", "ts": "2026-11-21T05:00:01.000+00:00", "request_id": "r1", "tenant": "acme",
              "from_tier": "small", "to_tier": "large", "status": 200, "judge_tier": "judge",
              "shadow_cost_usd": 0.0123, "judge_cost_usd": 0.0003, "prompt_tokens": 10, "completion_tokens": 5}
    unjudged = {**shadow, "judge_tier": None, "shadow_cost_usd": 0.02, "judge_cost_usd": 0.0}
    log = tmp_path / "requests.log"
    log.write_text("".join(json.dumps(line) + "\n" for line in (request, shadow, unjudged)))
    out = tmp_path / "costs.csv"
    assert run_costs([str(log), "--csv", str(out)]) == 0
    with out.open() as f:
        rows = {(r["tenant"], r["tier"]): r for r in csv.DictReader(f)}
    assert rows[("acme", "large")]["shadow_cost_usd"] == "0.0320" and rows[("acme", "large")]["requests"] == "0"
    assert rows[("acme", "judge")]["shadow_cost_usd"] == "0.0003" and rows[("acme", "judge")]["shadow_calls"] == "1"
    assert rows[("acme", "small")]["cost_usd"] == "0.001" and rows[("acme", "small")]["shadow_cost_usd"] == "0"
    total = rows[("TOTAL", "")]
    assert (total["requests"], total["cost_usd"], total["shadow_cost_usd"], total["spend_usd"]) == (
        "1", "0.001", "0.0323", "0.0333")
    text = capsys.readouterr().out
    assert "shadow $" in text and "Spend: $0.0333 = requests $0.0010 (cost $) + shadow comparisons $0.0323" in text
    assert "2 shadow lines" in text
