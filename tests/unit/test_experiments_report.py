"""`gateway experiments report`: per-arm figures, bootstrap intervals and verdicts from request logs."""

from __future__ import annotations

import csv
import gzip
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from gateway.experiments.cli import run_experiments
from gateway.experiments.report import METRICS, Row, _replicates, analyze, collect

ROOT = Path(__file__).resolve().parents[2]
N = 400


def request(rid: str, arm: str, ttft: float, *, status: int = 200, cost: float = 0.001, tpot: float = 20.0,
            control: bool = False, experiment: str = "slow-tier", **extra: Any) -> dict[str, Any]:
    return {"event": "request", "request_id": rid, "ts": "2026-01-01T00:00:00.000+00:00", "tenant": "t",
            "tier": "small-int4", "status": status, "ttft_ms": ttft if status == 200 else None, "tpot_ms": tpot,
            "e2e_ms": ttft + 50 * tpot, "cost_usd": cost, "experiment": experiment, "arm": arm,
            "arm_control": control, **extra}


def write_log(path: Path, lines: list[dict[str, Any]], gz: bool = False) -> Path:
    data = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def two_arms(seed: int = 1) -> list[dict[str, Any]]:
    """Control: TTFT ~ 100 ms; `slow`: ~150 ms on a slower tier but half the cost; TPOT the same in both."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(N):
        lines.append(request(f"c{i}", "control", float(rng.normal(100, 15)), tpot=float(rng.normal(20, 3)),
                             control=True, cost=0.002))
        lines.append(request(f"s{i}", "slow", float(rng.normal(150, 15)), tpot=float(rng.normal(20, 3)),
                             cost=0.001))
    lines.append({"event": "config_reloaded", "version": "x"})
    lines.append(request("n1", "control", 10.0) | {"experiment": None, "arm": None})  # not in an experiment
    return lines


def by(rows: list[Row], metric: str, arm: str) -> Row:
    return next(r for r in rows if r.metric == metric and r.arm == arm)


def test_a_slower_arm_is_worse_on_ttft_cheaper_on_cost_and_inconclusive_on_tpot(tmp_path: Path) -> None:
    log = write_log(tmp_path / "requests.log", two_arms())
    collected = collect([log])
    rows = analyze(collected, n_boot=500)
    assert [(r.arm, r.n, r.control) for r in rows if r.metric == "requests"] == [("control", N, True),
                                                                                 ("slow", N, False)]
    ttft = by(rows, "ttft_p50", "slow")
    assert ttft.verdict == "worse" and ttft.diff is not None and 40 < ttft.diff < 60
    assert ttft.diff_lo is not None and ttft.diff_lo > 0  # the interval excludes zero
    assert ttft.lo is not None and ttft.hi is not None and ttft.lo < ttft.value < ttft.hi  # type: ignore[operator]
    assert by(rows, "ttft_p99", "slow").verdict == "worse"
    assert by(rows, "e2e_p50", "slow").verdict == "worse"
    assert by(rows, "cost_per_1k", "slow").verdict == "better"
    assert by(rows, "cost_per_1k", "slow").value == pytest.approx(1.0)  # USD per 1,000 requests
    tpot = by(rows, "tpot_p50", "slow")
    assert tpot.verdict == "inconclusive" and tpot.diff_lo < 0 < tpot.diff_hi  # type: ignore[operator]
    assert by(rows, "ttft_p50", "control").verdict == "control"
    assert not any(r.metric in ("feedback", "agreement") for r in rows)  # no such lines: no rows


def test_goodput_uses_the_slo_and_errors_count_against_it(tmp_path: Path) -> None:
    lines = two_arms()
    lines += [request(f"e{i}", "control", 0.0, status=503, control=True) for i in range(40)]
    log = write_log(tmp_path / "requests.log", lines)
    rows = analyze(collect([log], slo_ms=130.0), n_boot=300)
    control, slow = by(rows, "goodput", "control"), by(rows, "goodput", "slow")

    def good(arm: str) -> int:
        return sum(1 for x in lines if x.get("arm") == arm and x["status"] == 200 and x["ttft_ms"] <= 130)

    assert control.n == N + 40 and control.value == pytest.approx(100 * good("control") / (N + 40))
    assert slow.value is not None and slow.value == pytest.approx(100 * good("slow") / N) and slow.value < 20
    assert slow.verdict == "worse"
    per_line = analyze(collect([write_log(tmp_path / "b.log", [request("a", "x", 200.0, ttft_slo_ms=300),
                                                                request("b", "x", 200.0, ttft_slo_ms=100)])]))
    assert by(per_line, "goodput", "x").value == 50.0  # each line's own SLO when --slo-ms is not given


def test_feedback_and_shadow_lines_are_matched_to_their_arm_by_request_id(tmp_path: Path) -> None:
    lines = two_arms()
    feedback = [{"event": "feedback", "request_id": f"c{i}", "tenant": "t", "score": 1.0} for i in range(60)]
    feedback += [{"event": "feedback", "request_id": f"s{i}", "tenant": "t", "score": 0.0} for i in range(60)]
    feedback += [{"event": "feedback", "request_id": "s0", "tenant": "t", "score": 1.0}]  # the last one counts
    feedback += [{"event": "feedback", "request_id": "unknown", "tenant": "t", "score": 1.0}]
    shadow = [{"event": "shadow", "request_id": f"s{i}", "tenant": "t", "experiment": "slow-tier", "arm": "slow",
               "agreement": 0.5, "shadow_cost_usd": 0.01} for i in range(30)]
    shadow += [{"event": "shadow", "request_id": f"c{i}", "tenant": "t", "agreement": 0.9} for i in range(30)]
    first = write_log(tmp_path / "requests.log.1.gz", feedback + shadow, gz=True)  # read before the requests
    second = write_log(tmp_path / "requests.log", lines)
    collected = collect([first, second])
    assert collected.unmatched_feedback == 1
    rows = analyze(collected, n_boot=300)
    assert by(rows, "feedback", "control").value == 1.0
    slow = by(rows, "feedback", "slow")
    assert slow.n == 60 and slow.value == pytest.approx(1 / 60) and slow.verdict == "worse"
    assert by(rows, "agreement", "slow").value == pytest.approx(0.5)
    assert by(rows, "agreement", "slow").verdict == "worse"
    assert collected.arms["slow-tier"]["slow"].shadow_cost == pytest.approx(0.3)


def test_quantile_replicates_equal_numpy_quantiles_of_the_same_resamples() -> None:
    values = np.random.default_rng(3).exponential(100, size=257)
    for metric in (m for m in METRICS if m.name in ("ttft_p50", "ttft_p99", "goodput")):
        fast = _replicates(values, metric, 50, 7, "e", "a")
        rng = np.random.default_rng([7, *(__import__("zlib").crc32(s.encode()) for s in ("e", metric.name, "a"))])
        picks = rng.integers(0, len(values), size=(50, len(values)), dtype=np.int32)
        ordered = np.sort(values)
        slow = [np.quantile(ordered[row], metric.quantile) if metric.quantile is not None else ordered[row].mean()
                for row in picks]
        assert fast is not None and np.allclose(fast, np.asarray(slow) * metric.scale)


def test_the_report_is_reproducible_and_the_control_can_be_named(tmp_path: Path) -> None:
    log = write_log(tmp_path / "requests.log", two_arms())
    assert analyze(collect([log]), n_boot=200, seed=5) == analyze(collect([log]), n_boot=200, seed=5)
    flipped = analyze(collect([log]), control="slow", n_boot=200)
    assert by(flipped, "ttft_p50", "control").verdict == "better"
    unmarked = [line | {"arm_control": False} for line in two_arms()]
    rows = analyze(collect([write_log(tmp_path / "u.log", unmarked)]), n_boot=200)
    assert by(rows, "ttft_p50", "slow").verdict == "worse"  # an arm named "control" is the control


def test_cli_prints_the_table_and_writes_csv_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_log(tmp_path / "requests.log", two_arms())
    out_csv, out_png = tmp_path / "arms.csv", tmp_path / "arms.png"
    status = run_experiments(["report", str(log), "--bootstrap", "300", "--csv", str(out_csv), "--png", str(out_png)])
    printed = capsys.readouterr().out
    assert status == 0
    assert "Experiment slow-tier: control arm control" in printed
    ttft_line = next(line for line in printed.splitlines() if line.startswith("ttft_p50") and " slow " in line)
    assert ttft_line.rstrip().endswith("worse")
    assert f"request lines in an experiment: {2 * N:,}" in printed
    with open(out_csv, newline="") as f:
        table = list(csv.DictReader(f))
    row = next(r for r in table if r["metric"] == "ttft_p50" and r["arm"] == "slow")
    assert row["verdict"] == "worse" and float(row["diff_ci_low"]) > 0 and row["control"] == "0"
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run_experiments(["report", str(tmp_path / "missing.log")]) == 2


def test_gateway_experiments_is_a_subcommand(tmp_path: Path) -> None:
    log = write_log(tmp_path / "requests.log", two_arms())
    done = subprocess.run([sys.executable, "-m", "gateway", "experiments", "report", str(log), "--bootstrap", "100",
                           "--experiment", "slow-tier"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "Experiment slow-tier" in done.stdout
