"""`gateway costs` as a `make run` user meets it: console text beside the log, tiny amounts, the chart."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path

import pytest

from gateway.accounting.aggregate import DailyCosts
from gateway.accounting.render import money_text
from gateway.accounting.report import run_costs
from gateway.local.up import EXAMPLE

LINE = {
    "event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "demo", "tier": "small-q4",
    "status": 200, "prompt_tokens": 12, "completion_tokens": 20, "ttft_ms": 40.0, "e2e_ms": 300.0,
    "cache": "miss", "cost_usd": 5e-06, "avoided_cost_usd": 0.0, "baseline_cost_usd": 2.5e-05, "saved_usd": 2e-05,
}  # fmt: skip


def console_capture(tmp_path: Path) -> Path:
    """What `make run > out.txt 2>&1` leaves: the banner of `gateway up`, then the request lines."""
    banner = EXAMPLE.format(host="127.0.0.1", port=8080, models="auto, small-q4", log="stdout",
                            dashboard="http://127.0.0.1:8080/dashboard?key=sk-dashboard")
    text = "embedded Redis on redis://127.0.0.1:6400/0 (log: /tmp/redis.log)\n" + banner
    path = tmp_path / "out.txt"
    path.write_text(text + "\n".join(json.dumps(LINE) for _ in range(3)) + "\n")
    return path


def test_console_text_is_not_counted_as_malformed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = console_capture(tmp_path)
    text_lines = sum(1 for line in path.read_text().splitlines() if line.strip() and not line.startswith("{"))
    assert text_lines >= 10
    assert run_costs([str(path)]) == 0
    out = capsys.readouterr().out
    assert "Malformed lines skipped: 0 (" in out
    assert f"Text lines skipped (not JSON objects: console output such as a banner, not counted as malformed): " \
           f"{text_lines}, the first at {path}:1" in out
    assert "request lines counted: 3" in out


def test_a_broken_log_line_is_still_malformed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "requests.log"
    path.write_text(json.dumps(LINE) + "\n" + json.dumps(LINE)[:40] + "\n")
    assert run_costs([str(path)]) == 0
    out = capsys.readouterr().out
    assert "Malformed lines skipped: 1 (not JSON: 1" in out and "Text lines skipped" not in out


def test_small_costs_show_significant_digits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "requests.log"
    path.write_text(json.dumps(LINE) + "\n")
    assert run_costs([str(path)]) == 0
    total = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("TOTAL"))
    cells = total.split()
    assert "0.000005" in cells and "0.00002" in cells  # cost and routing savings
    assert "0.0000" not in cells


@pytest.mark.parametrize(("value", "digits", "text"), [
    (Decimal("0.000005"), 4, "0.000005"), (Decimal("0.0000049"), 4, "0.0000049"), (Decimal("12.34567"), 4, "12.3457"),
    (Decimal("1234.5"), 4, "1,234.5000"), (Decimal("0.0123456"), 4, "0.0123"), (Decimal("-0.000012"), 4, "-0.000012"),
    (0.000005123, 6, "0.00000512"), (Decimal("0.000000001"), 4, "0.000000001"), (0.25, 6, "0.250000"), (Decimal(0), 4, "0"),
])  # fmt: skip
def test_money_text(value: Decimal | float, digits: int, text: str) -> None:
    assert money_text(value, digits) == text


def test_the_chart_title_and_legend_are_inside_the_figure() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from gateway.accounting.plot import DPI, figure

    daily = DailyCosts()
    for tier in ("small-q4", "large-f16", "all-minilm-l6-v2", None):  # what `make run` logs: the legend is wide
        daily.cost[date(2026, 11, 21), tier] = Decimal("0.000005")
    daily.routing[date(2026, 11, 21)] = Decimal("0.00001")
    fig = figure(daily)
    fig.set_dpi(DPI)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = {id(label) for ax in fig.axes for label in (*ax.get_xticklabels(), *ax.get_yticklabels())}
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text() and id(t) not in ticks]
    assert any("Cost by tier per day" in t.get_text() for t in texts)
    box = fig.bbox
    for text in texts:
        extent = text.get_window_extent(renderer)
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, (text.get_text(), extent)
        assert box.y0 <= extent.y0 and extent.y1 <= box.y1, (text.get_text(), extent)
    labels = [label.get_text() for label in fig.axes[0].get_yticklabels()]
    assert "0.00001" in labels  # dollars as written, not a 1e-5 offset
