"""gateway.bench.summary: vLLM-style metrics checked against values computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.bench.client import RequestResult
from gateway.bench.report import format_table, replace_marked
from gateway.bench.runner import RunResult
from gateway.bench.summary import parse_goodput, percentile, result_json, summarize


def _run() -> RunResult:
    # three successes and one failure over 2 s
    a = RequestResult(True, 200, ttft_s=0.100, itl_s=[0.02, 0.04], tpot_s=0.03, e2e_s=0.160,
                      output_tokens=3, prompt_tokens=10)
    b = RequestResult(True, 200, ttft_s=0.300, itl_s=[0.10], tpot_s=0.10, e2e_s=0.400,
                      output_tokens=2, prompt_tokens=20)
    c = RequestResult(True, 200, ttft_s=0.200, itl_s=[], tpot_s=None, e2e_s=0.200,
                      output_tokens=1, prompt_tokens=30)
    bad = RequestResult(False, 429, e2e_s=0.001, prompt_tokens=40, error="HTTP 429: slow down")
    return RunResult([a, b, c, bad], duration_s=2.0, started_at=0.0)


def test_percentile_interpolates_linearly() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert math.isnan(percentile([], 50))


def test_summary_counts_throughput_and_latencies() -> None:
    s = summarize(_run(), percentiles=[50, 90, 99])
    assert (s["completed"], s["failed"]) == (3, 1)
    assert s["total_input_tokens"] == 60 and s["total_output_tokens"] == 6  # failures not counted
    assert s["request_throughput"] == 1.5 and s["output_throughput"] == 3.0
    assert s["total_token_throughput"] == 33.0
    assert s["mean_ttft_ms"] == pytest.approx(200.0) and s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p90_ttft_ms"] == pytest.approx(280.0)  # 200 + 0.8 * 100
    assert s["std_ttft_ms"] == pytest.approx(math.sqrt(20000 / 3))
    assert s["mean_tpot_ms"] == pytest.approx(65.0)  # one-token answers have no TPOT
    assert s["mean_itl_ms"] == pytest.approx(160 / 3) and s["p50_itl_ms"] == pytest.approx(40.0)
    assert s["p99_e2el_ms"] == pytest.approx(200 + 0.98 * 200)  # sorted 160, 200, 400: rank 1.98
    assert s["errors"] == {"HTTP 429: slow down": 1}
    assert "request_goodput" not in s


def test_goodput_counts_requests_meeting_every_slo() -> None:
    # ttft <= 250 keeps a and c; tpot <= 50 keeps a and c (c: one token, TPOT 0); e2el <= 180 keeps a
    assert summarize(_run(), parse_goodput(["ttft:250", "tpot:50"]))["request_goodput"] == 1.0
    assert summarize(_run(), parse_goodput(["ttft:250", "e2el:180"]))["request_goodput"] == 0.5
    assert summarize(_run(), parse_goodput(["ttft:1000"]))["request_goodput"] == 1.5


@pytest.mark.parametrize("item", ["ttft", "foo:1", "ttft:abc", "tpot:-1"])
def test_parse_goodput_rejects_bad_items(item: str) -> None:
    with pytest.raises(ValueError, match="goodput SLO"):
        parse_goodput([item])


def test_empty_run_and_result_json() -> None:
    s = summarize(RunResult([], 1.0, 0.0))
    assert s["completed"] == 0 and math.isnan(s["mean_ttft_ms"])
    data = result_json(summarize(_run()), _run(), {"request_rate": 4.0})
    assert data["request_rate"] == 4.0 and data["ttfts"][:3] == [0.1, 0.3, 0.2]
    assert data["output_lens"] == [3, 2, 1, 0] and data["date"].startswith("1970-01-01")
    table = format_table(summarize(_run(), parse_goodput(["ttft:250"])))
    assert "Request goodput (req/s):" in table and "P99 TTFT (ms):" in table and "HTTP 429" in table


def test_replace_marked_replaces_only_its_block(tmp_path: Path) -> None:
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\nother section\n")
    replace_marked(doc, "x", "| a |\n| 1 |", heading="## X")
    replace_marked(doc, "y", "why")
    replace_marked(doc, "x", "| a |\n| 2 |")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nother section\n\n## X\n\n<!-- begin x -->\n| a |\n| 2 |\n<!-- end x -->")
    assert text.count("<!-- begin x -->") == 1 and "| 1 |" not in text and text.endswith("why\n<!-- end y -->\n")
