"""The shared parts of the benchmarks: CPU probe, phases, gateway readers, result files and doc sections."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import orjson
import pytest

from gateway.bench.client import RequestResult
from gateway.bench.cpu import CpuProbe, cpu_seconds, per_request_us, tick_cpu_seconds
from gateway.bench.phases import Budget, Phase, merge_phases, phase_summary
from gateway.bench.readers import diff_counts, log_events, log_lines, parse_redis_ops, read_log
from gateway.bench.report import md_table, replace_marked, write_results
from gateway.bench.runner import RunResult

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_probe_measures_each_group_over_the_block() -> None:
    clock = {1: 10.0, 2: 1.0, 3: 2.0}
    probe = CpuProbe({"one": 1, "pair": [2, 3], "none": None}, read=lambda pid: clock[pid])
    with probe.measure() as used:
        assert used == {}  # filled on exit
        clock.update({1: 10.5, 2: 1.25, 3: 3.0})
    assert used == {"one": 0.5, "pair": 1.25, "none": 0.0}
    assert probe.now() == {"one": 10.5, "pair": 4.25, "none": 0.0} and isinstance(probe.now()["none"], float)


def test_cpu_seconds_of_this_process_follow_its_work() -> None:
    pid = os.getpid()
    ticks_before = tick_cpu_seconds(pid)
    with CpuProbe({"me": pid}).measure() as used:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
    ticks = tick_cpu_seconds(pid) - ticks_before
    assert 0.18 <= used["me"] < 1.0  # schedstat: this process's threads, to the nanosecond
    assert abs(used["me"] - ticks) < 0.1  # the 10 ms ticks agree roughly over the same work
    assert cpu_seconds(pid) >= used["me"]  # the total since the process started
    assert per_request_us(0.5, 1000) == 500.0 and math.isnan(per_request_us(1.0, 0))


def _result(ok: bool, e2e_ms: float, error: str | None = None, status: int = 200) -> RequestResult:
    return RequestResult(ok, status, e2e_s=e2e_ms / 1e3, error=error)


def test_phase_summary_counts_latencies_and_cpu_per_request() -> None:
    results = [_result(True, ms) for ms in (10, 20, 30, 40)] + [_result(False, 1, "HTTP 503: busy", 503)]
    phase = Phase("gateway", 8, RunResult(results, 2.5, 0.0), gateway_cpu_s=0.01)
    s = phase_summary(phase)
    assert (s["name"], s["concurrency"], s["n"], s["errors"]) == ("gateway", 8, 5, 1)
    assert s["rps"] == 2.0 and s["wall_s"] == 2.5 and not s["truncated"]
    assert s["p50_ms"] == pytest.approx(25.0) and s["p90_ms"] == pytest.approx(37.0)  # 10..40, linear
    assert s["max_ms"] == pytest.approx(40.0) and s["mean_ms"] == pytest.approx(25.0)
    assert s["error_samples"] == ["HTTP 503: busy"]
    assert s["gateway_cpu_us_per_req"] == pytest.approx(2000.0) and s["gateway_core_util"] == pytest.approx(0.004)
    hits = phase_summary(phase, only=results[:2])
    assert hits["n"] == 2 and hits["p50_ms"] == pytest.approx(15.0) and hits["rps"] == 2.0  # rate of the phase


def test_merge_phases_sums_cpu_only_when_probed() -> None:
    a = Phase("x", 4, RunResult([_result(True, 5)], 1.0, 0.0), 0.2)
    b = Phase("x", 4, RunResult([_result(True, 7)], 2.0, 1.0, truncated=True), 0.3)
    merged = merge_phases([a, b])
    assert (merged.name, merged.concurrency, len(merged.samples)) == ("x", 4, 2)
    assert merged.wall_s == 3.0 and merged.truncated and merged.gateway_cpu_s == pytest.approx(0.5)
    direct = merge_phases([Phase("d", 1, RunResult([], 1.0, 0.0))])
    assert direct.gateway_cpu_s is None and "gateway_cpu_us_per_req" not in phase_summary(direct)


def test_budget_limits_phases_then_skips_them() -> None:
    said: list[str] = []
    budget = Budget(0.05, 10.0, said.append)
    assert budget.limit() == 1.0 and not budget.spent("first")  # never under 1 s
    assert Budget(100.0, 10.0).limit() == 10.0
    time.sleep(0.06)
    assert budget.spent("second") and budget.skipped == ["second"]
    assert said == ["  SKIPPED second: the run's time budget (0 s) is spent"]


METRICS = """# HELP gateway_redis_op_seconds ...
gateway_redis_up 1.0
gateway_redis_op_seconds_bucket{le="0.001",op="cache_get"} 90.0
gateway_redis_op_seconds_bucket{le="+Inf",op="cache_get"} 100.0
gateway_redis_op_seconds_count{op="cache_get"} 100.0
gateway_redis_op_seconds_count{op="cache_put"} 40.0
gateway_redis_errors_total{op="cache_get"} 3.0
gateway_requests_in_flight 0.0
"""


def test_redis_ops_from_metrics_and_their_difference() -> None:
    ops = parse_redis_ops(METRICS)
    assert ops.up == 1.0 and ops.ok == {"cache_get": 100.0, "cache_put": 40.0} and ops.failed == {"cache_get": 3.0}
    assert ops.calls() == {"cache_get": 103.0, "cache_put": 40.0}
    assert ops.buckets == {"cache_get": {"0.001": 90.0, "+Inf": 100.0}}
    later = parse_redis_ops(METRICS.replace("} 100.0", "} 150.0").replace("errors_total{op=\"cache_get\"} 3.0",
                                                                            "errors_total{op=\"cache_get\"} 3.0"))
    diff = later.minus(ops)
    assert diff.ok == {"cache_get": 50.0} and diff.failed == {} and diff.buckets["cache_get"]["+Inf"] == 50.0
    assert diff_counts({"a": 3, "b": 1}, {"a": 1, "b": 1}) == {"a": 2}


def test_log_readers(tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    lines = [{"event": "request", "request_id": "r1", "cache": "hit"}, {"event": "redis_recovered"},
             {"event": "request", "request_id": "r2", "cache": "miss"}]
    log.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\nnot json\n[1, 2]\n")
    assert list(read_log(log)) == lines
    assert log_events(log) == {"events": {"request": 2, "redis_recovered": 1}, "cache": {"hit": 1, "miss": 1}}
    assert set(log_lines(log, {"r1", "r2"})) == {"r1", "r2"}
    t0 = time.monotonic()
    assert set(log_lines(log, {"r1", "r3"}, timeout_s=0.3)) == {"r1"} and time.monotonic() - t0 >= 0.3
    assert list(read_log(tmp_path / "absent.log")) == []


def test_md_table_and_result_files(tmp_path: Path) -> None:
    assert md_table(["a", "b"], [[1, "x"], [2.5, None]], "--- ---:") == \
        "| a | b |\n| --- | ---: |\n| 1 | x |\n| 2.5 | None |"
    path = write_results("demo", "20260101-120000", {"n": 1, "at": Path("/x")}, "# demo", tmp_path / "r")
    assert path == tmp_path / "r" / "demo-20260101-120000.json"
    assert json.loads(path.read_text()) == {"n": 1, "at": "/x"}
    assert (tmp_path / "r" / "demo-20260101-120000.md").read_text() == "# demo\n"


def test_replace_marked_appends_then_replaces_in_place(tmp_path: Path) -> None:
    doc = tmp_path / "B.md"
    doc.write_text("# B\n\n<!-- begin overload -->\nold\n<!-- end overload -->\n\n## After\n")
    replace_marked(doc, "overload", "new\n\n![plot](p.png)\n")
    assert doc.read_text() == "# B\n\n<!-- begin overload -->\nnew\n\n![plot](p.png)\n<!-- end overload -->\n\n## After\n"
    missing = tmp_path / "new.md"
    replace_marked(missing, "x", "body", heading="## X")
    assert missing.read_text() == "\n\n## X\n\n<!-- begin x -->\nbody\n<!-- end x -->\n"


def test_benchmarks_doc_sections_are_the_writers_markers() -> None:
    """Every generated section of docs/BENCHMARKS.md is one begin/end pair in replace_marked's format,
    under the names the scripts write (compare.py, routing_quality.py, overload.py)."""
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    begins = re.findall(r"<!-- begin ([\w-]+) -->", text)
    assert sorted(begins) == sorted(set(begins)) and {"issue-9-compare", "issue-9-routing", "overload"} <= set(begins)
    for name in begins:
        assert text.count(f"<!-- end {name} -->") == 1 and text.index(f"<!-- begin {name} -->") < \
            text.index(f"<!-- end {name} -->")
    assert ":begin -->" not in text and ":end -->" not in text  # no section left in another marker format
