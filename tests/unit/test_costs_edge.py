"""Issue 37: `gateway costs` and `gateway whatif` on a log holding both inference lines and edge lines.

Edge lines (gateway.edge.accounted: dashboard polls, static files, admin, count_tokens, unknown paths, parser
refusals with `path: null`) carry cost 0 and usually no tier; an open dashboard writes ~28,800 a day. They are
counted apart (`other_endpoint_requests`), never as requests nor in the per-request figures; a line with no
`path` key (written before the field existed) is an inference request.
"""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.accounting.reader import ReadStats, read_records
from gateway.accounting.records import inference_line
from gateway.accounting.report import run_costs
from gateway.whatif.records import LogStats, read_logged

TS = "2026-11-21T05:00:00.000+00:00"
BASE: dict[str, Any] = {"event": "request", "ts": TS, "tenant": "acme", "status": 200, "prompt_tokens": 10,
                        "completion_tokens": 5, "cache": "miss"}
INFERENCE: list[dict[str, Any]] = [
    {**BASE, "path": "/v1/chat/completions", "tier": "small", "cost_usd": 0.002, "ttft_ms": 100.0, "e2e_ms": 400.0},
    {**BASE, "path": "/v1/embeddings", "tier": "small", "cost_usd": 0.0001, "ttft_ms": None, "e2e_ms": 200.0},
    {**BASE, "tier": "small", "cost_usd": 0.001, "ttft_ms": 120.0, "e2e_ms": 300.0},  # no path: before the field
    {**BASE, "path": "/v1/messages", "tier": None, "status": 429, "prompt_tokens": 0, "completion_tokens": 0,
     "cost_usd": 0.0, "ttft_ms": None, "e2e_ms": 1.0},
    {**BASE, "path": "/v1/responses", "tier": "small", "cost_usd": 0.003, "ttft_ms": 90.0, "e2e_ms": 500.0},
    {**BASE, "path": "/v1/completions", "tier": "small", "cost_usd": 0.0005, "ttft_ms": 80.0, "e2e_ms": 350.0},
]
EDGE_BASE: dict[str, Any] = {**BASE, "tier": None, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0,
                             "ttft_ms": None, "e2e_ms": 0.5}
EDGE: list[dict[str, Any]] = [
    *({**EDGE_BASE, "path": "/dashboard/data.json"} for _ in range(6)),  # acme's open dashboard, polling
    {**EDGE_BASE, "path": "/dashboard/static/app.js", "status": 304},
    {**EDGE_BASE, "path": "/admin/config", "status": 401},
    {**EDGE_BASE, "path": "/v1/messages/count_tokens", "prompt_tokens": 40},
    {**EDGE_BASE, "path": "/v1/models"},
    {**EDGE_BASE, "tenant": "anonymous", "path": "/v2/nothing-here", "status": 404},
    {**EDGE_BASE, "tenant": "anonymous", "path": None, "status": 400},  # refused by aiohttp's parser
    {**EDGE_BASE, "tenant": "anonymous", "path": "/v1/chat/completions/extra", "status": 404},
]
ACME_EDGE = 10


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "requests.log"
    lines = [*INFERENCE[:2], *EDGE[:5], *INFERENCE[2:], *EDGE[5:]]  # interleaved, as a day's log is
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _csv(tmp_path: Path, log: Path, *by: str) -> dict[tuple[str, ...], dict[str, str]]:
    out = tmp_path / "costs.csv"
    assert run_costs([str(log), "--csv", str(out), *(("--by", ",".join(by)) if by else ())]) == 0
    keys = by or ("tenant", "tier")
    with out.open() as f:
        return {tuple(row[k] for k in keys): row for row in csv.DictReader(f)}


def test_inference_line_by_path() -> None:
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"):
        assert inference_line({"path": path})
    assert inference_line({})  # a line from before the path field: only the request path logged then
    others: tuple[object, ...] = (None, "/dashboard/data.json", "/admin/config", "/v1/messages/count_tokens",
                                  "/v1/feedback", "/v1/models", "/v1/chat/completions/", "/", ["/v1/chat/completions"])
    for other in others:
        assert not inference_line({"path": other}), other


def test_edge_lines_are_counted_apart_per_tenant(tmp_path: Path, log: Path) -> None:
    rows = _csv(tmp_path, log, "tenant")
    acme, anonymous, total = rows[("acme",)], rows[("anonymous",)], rows[("TOTAL",)]
    assert (acme["requests"], acme["errors"], acme["other_endpoint_requests"]) == ("6", "1", str(ACME_EDGE))
    assert acme["prompt_tokens"] == "50"  # count_tokens' 40 counted input is no backend's work
    assert (anonymous["requests"], anonymous["errors"], anonymous["other_endpoint_requests"]) == ("0", "0", "3")
    assert (total["requests"], total["errors"], total["other_endpoint_requests"]) == ("6", "1", "13")
    assert Decimal(total["cost_usd"]) == Decimal(total["spend_usd"]) == Decimal("0.0066")


def test_per_request_figures_cover_inference_only(tmp_path: Path, log: Path) -> None:
    """Ten $0, 0.5 ms dashboard polls would drag acme's p50 $/req to 0 and its e2e p50 to 0.5 ms."""
    acme = _csv(tmp_path, log, "tenant")[("acme",)]
    assert Decimal(acme["cost_p50_usd"]) == Decimal("0.001")  # of the 5 served: 0.0001, 0.0005, 0.001, 0.002, 0.003
    assert float(acme["e2e_p50_ms"]) == 350.0
    assert float(acme["ttft_p50_ms"]) == pytest.approx(95.0)  # 80, 90, 100, 120


def test_edge_lines_on_the_no_tier_row_are_not_requests(tmp_path: Path, log: Path) -> None:
    none = _csv(tmp_path, log)[("acme", "(none)")]  # the refused /v1/messages and acme's edge lines
    assert (none["requests"], none["errors"], none["other_endpoint_requests"]) == ("1", "1", str(ACME_EDGE))


def test_table_and_summary_say_so(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_costs([str(log), "--by", "tenant"]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.startswith("tenant"))
    assert header.split()[-2:] == ["other", "endpoints"]
    acme = next(line for line in text.splitlines() if line.startswith("acme"))
    assert acme.split()[1] == "6" and acme.split()[-1] == str(ACME_EDGE)
    assert "request lines counted: 6;" in text
    assert "counted apart from requests: 13" in text


def test_reader_marks_edge_records(log: Path) -> None:
    stats = ReadStats()
    records = list(read_records([log], stats))
    assert (stats.records, stats.edge_lines) == (6, 13)
    assert sum(r.edge for r in records) == 13 and all(r.tier is None for r in records if r.edge)


def test_whatif_replays_inference_lines_only(log: Path) -> None:
    stats = LogStats()
    replayed = list(read_logged([log], stats))
    assert (stats.requests, stats.other_paths) == (6, 13)
    assert sorted(r.endpoint for r in replayed) == ["chat", "chat", "chat", "chat", "completions", "embeddings"]
