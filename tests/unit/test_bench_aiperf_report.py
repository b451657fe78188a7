"""gateway.bench.aiperf_report: aiperf's records read and joined to the gateway's log lines by x-request-id,
/metrics histograms differenced and their quantile, the gateway's figures from its log (issue 41)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from gateway.bench.aiperf_report import (
    Histogram,
    diff_pct,
    gateway_figures,
    joined,
    joined_summary,
    metrics_figures,
    parse_metrics,
    tool_records,
)


def _record(rid: str | None, ttft: float, itl: float, osl: int, isl: int, status: int = 200) -> dict[str, object]:
    m = {"time_to_first_token": ttft, "inter_token_latency": itl, "request_latency": ttft + itl * (osl - 1),
         "output_sequence_length": osl, "input_sequence_length": isl, "usage_completion_tokens": osl,
         "http_req_connecting": 0.5, "http_req_sending": 0.25}
    return {"metadata": {"request_start_ns": 1, "request_end_ns": 2, "benchmark_phase": "profiling"},
            "metrics": {k: {"value": v, "unit": "ms"} for k, v in m.items()},
            "trace_data": {"response_status_code": status, "response_headers": {"X-Request-ID": rid} if rid else {}}}


def test_records_join_the_gateway_lines_by_request_id(tmp_path: Path) -> None:
    path = tmp_path / "profile_export.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        _record("a", 110.0, 20.0, 64, 63), _record("b", 210.0, 30.0, 64, 63), _record(None, 1.0, 1.0, 2, 2),
        _record("c", 5.0, 1.0, 2, 2, status=503))) + "\n")
    records = tool_records(path)
    assert [r.request_id for r in records] == ["a", "b", None, "c"]
    assert [r.ok for r in records] == [True, True, True, False]
    lines: dict[str, dict[str, Any]] = {
        "a": {"status": 200, "ttft_ms": 100.0, "tpot_ms": 19.5, "e2e_ms": 1330.0, "completion_tokens": 64,
              "prompt_tokens": 72},
        "b": {"status": 200, "ttft_ms": 206.0, "tpot_ms": 30.0, "e2e_ms": 2100.0, "completion_tokens": 63,
              "prompt_tokens": 72},
        "c": {"status": 503}}
    rows = joined(records, lines)
    assert len(rows) == 2  # no header, and a refused request: not joined
    assert rows[0]["ttft_ms"] == pytest.approx(10.0) and rows[1]["ttft_ms"] == pytest.approx(4.0)
    assert rows[0]["isl"] == -9 and rows[1]["osl"] == 1
    summary = joined_summary(rows)
    assert summary["joined"] == 2 and summary["ttft_ms_p50"] == pytest.approx(7.0)
    assert summary["osl_exact"] == 1 and summary["connect_send_ms_mean"] == pytest.approx(0.75)


def test_gateway_figures_from_the_log() -> None:
    lines: list[dict[str, Any]] = [
        {"status": 200, "ttft_ms": t, "tpot_ms": 10.0, "e2e_ms": 1000.0, "arrival_s": 100.0 + i,
         "completion_tokens": 50, "prompt_tokens": 20} for i, t in enumerate((100.0, 200.0, 300.0))]
    lines.append({"status": 503, "ttft_ms": None, "arrival_s": 90.0, "e2e_ms": 1.0})
    g = gateway_figures(lines)
    assert g["requests"] == 3 and g["ttft_p50_ms"] == 200.0 and g["ttft_mean_ms"] == 200.0
    assert g["duration_s"] == pytest.approx(3.0)  # first 200's arrival to the last one's end
    assert g["output_tps"] == pytest.approx(50.0) and g["input_tokens"] == 60
    assert diff_pct(100.0, 95.0) == pytest.approx(-5.0) and math.isnan(diff_pct(0.0, 1.0))


SCRAPE = """\
# TYPE gateway_ttft_seconds histogram
gateway_ttft_seconds_bucket{{status="200",tier="a",le="0.05"}} {a05}
gateway_ttft_seconds_bucket{{status="200",tier="a",le="0.1"}} {a1}
gateway_ttft_seconds_bucket{{status="200",tier="a",le="+Inf"}} {a1}
gateway_ttft_seconds_sum{{status="200",tier="a"}} {asum}
gateway_ttft_seconds_count{{status="200",tier="a"}} {a1}
gateway_ttft_seconds_bucket{{status="200",tier="b",le="0.05"}} 0.0
gateway_ttft_seconds_bucket{{status="200",tier="b",le="0.1"}} {b1}
gateway_ttft_seconds_bucket{{status="200",tier="b",le="+Inf"}} {b1}
gateway_ttft_seconds_sum{{status="200",tier="b"}} {bsum}
gateway_ttft_seconds_count{{status="200",tier="b"}} {b1}
# TYPE gateway_requests counter
gateway_requests_total{{status="200",tier="a"}} {a1}
gateway_requests_total{{status="200",tier="b"}} {b1}
"""


def test_metrics_difference_sums_tiers_and_interpolates_the_quantile() -> None:
    before = parse_metrics(SCRAPE.format(a05=1, a1=1, asum=0.04, b1=0, bsum=0))
    after = parse_metrics(SCRAPE.format(a05=3, a1=5, asum=0.34, b1=2, bsum=0.16))
    run = after.minus(before)
    ttft = run.histograms["gateway_ttft_seconds"]
    assert ttft.count == 6 and ttft.sum == pytest.approx(0.46)
    assert ttft.buckets == {0.05: 2.0, 0.1: 6.0, math.inf: 6.0}
    # rank 3 of 6: in (0.05, 0.1], one of its four observations in: 0.05 + 0.05 * 1/4
    assert ttft.quantile(0.5) == pytest.approx(0.0625) and ttft.bucket_of(0.5) == (0.05, 0.1)
    figures = metrics_figures(run)
    assert figures["requests"] == 6 and figures["ttft_mean_ms"] == pytest.approx(460 / 6)
    assert math.isnan(figures["itl_mean_ms"])  # no TPOT series scraped: no figure, not 0


def test_quantile_in_the_overflow_bucket_is_its_lower_bound() -> None:
    h = Histogram({0.1: 1.0, math.inf: 4.0}, 10.0, 4.0)
    assert h.quantile(0.9) == 0.1 and math.isnan(Histogram({}, 0.0, 0.0).quantile(0.5))
