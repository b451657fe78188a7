"""The replay's outputs: the JSON object, the terminal table and the self-contained HTML report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any

from gateway.config import GatewayConfig
from gateway.whatif import svg
from gateway.whatif.summary import NONE, Tally

SCENARIOS = ("recorded", "baseline", "candidate")


def document(tallies: Mapping[str, Tally], meta: dict[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """{recorded, baseline, candidate} (each `Tally.figures`), with `meta` and `calibration` beside them."""
    out: dict[str, Any] = {name: tallies[name].figures() for name in SCENARIOS if name in tallies}
    out["meta"] = meta
    if calibration is not None:
        out["calibration"] = calibration
    return out


def table(doc: Mapping[str, Any]) -> str:
    """Tier by tier, each scenario's share, requests, cost and TTFT; then totals and refusals."""
    names = [n for n in SCENARIOS if n in doc]
    tiers = sorted({t for n in names for t in doc[n]["tiers"]})
    head = f"{'tier':<16}" + "".join(f"{n + ' share':>17}{'$':>11}{'p50 ms':>9}{'p99 ms':>9}" for n in names)
    rows = [head, "-" * len(head)]
    for tier in tiers:
        cells = []
        for n in names:
            t = doc[n]["tiers"].get(tier, {})
            cells.append(f"{100 * t.get('share', 0):>16.2f}%{t.get('cost_usd', 0):>11.4f}"
                         f"{_ms(t.get('ttft_p50_ms')):>9}{_ms(t.get('ttft_p99_ms')):>9}")
        rows.append(f"{tier:<16}" + "".join(cells))
    rows.append("-" * len(head))
    rows.append(f"{'TOTAL':<16}" + "".join(f"{doc[n]['requests']:>16} {doc[n]['cost_usd']:>11.4f}"
                                           f"{_ms(doc[n]['ttft_p50_ms']):>9}{_ms(doc[n]['ttft_p99_ms']):>9}"
                                           for n in names))
    for n in names:
        refused = ", ".join(f"{k} {v}" for k, v in doc[n]["refused"].items()) or "none"
        rows.append(f"{n} refused: {refused}")
    if any(doc[n].get("spilled") or doc[n].get("held_by_session") for n in names):
        rows.append("spilled / held by a session: " + ", ".join(
            f"{n} {doc[n].get('spilled', 0)} / {doc[n].get('held_by_session', 0)}" for n in names))
    meta = doc.get("meta", {})
    rows.append(f"window: {meta.get('window', {}).get('sampled', '')}{_replays(meta)}")
    if meta.get("price_only"):
        rows.append(f"{meta['price_only']} lines without the replay fields: replayed for price only")
    calibration = doc.get("calibration")
    if calibration is not None:
        rows.append(f"calibration (baseline vs recorded): cost {_pct(calibration['cost'])}, "
                    f"ttft p50 {_pct(calibration['ttft_p50'])}{_at(calibration.get('ttft_p50_at'))}, "
                    f"p99 {_pct(calibration['ttft_p99'])}{_at(calibration.get('ttft_p99_at'))}, "
                    f"largest share error {calibration['max_share_points']:.2f} points")
    return "\n".join(rows)


def html(doc: Mapping[str, Any], tallies: Mapping[str, Tally], candidate: GatewayConfig) -> str:
    """The report as one HTML file: tables and inline SVG charts, nothing fetched."""
    names = [n for n in SCENARIOS if n in doc]
    parts = [f"<h1>gateway whatif</h1><p>{escape(_meta_line(doc.get('meta', {})))}</p>",
             "<h2>Overall</h2>", _overall(doc, names)]
    if "calibration" in doc:
        parts += ["<h2>Error bars (the baseline replayed against what the log recorded)</h2>",
                  _calibration(doc["calibration"])]
    hours = sorted({h for n in names for (h, _) in tallies[n].by_hour})
    for n in names:
        tiers = sorted({t for (_, t) in tallies[n].by_hour})
        series = {t: [(h, float(tallies[n].by_hour.get((h, t), 0))) for h in hours] for t in tiers}
        parts.append(svg.lines(f"{n}: requests per hour by tier (tier mix over time)", series,
                               x_label="hours since epoch"))
    days = sorted({d for n in names for d in doc[n]["cost_by_day"]})
    parts.append(svg.bars("Cost per day (USD)", days, {n: [doc[n]["cost_by_day"].get(d, 0.0) for d in days]
                                                      for n in names}, "$"))
    parts.append(_ttft_chart(tallies, names))
    reasons = sorted({r for n in names for r in doc[n]["refused"]})
    if reasons:
        parts.append(svg.bars("Refused requests: 429 (whole log) and shed (window)", reasons,
                              {n: [float(doc[n]["refused"].get(r, 0)) for r in reasons] for n in names}))
    parts += _burn(tallies, names, candidate)
    parts += ["<h2>Per tenant</h2>", _tenants(doc, names)]
    style = ("body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}th:first-child,td:first-child"
             "{text-align:left}figure{margin:1em 0}figcaption{font-weight:bold}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>gateway whatif</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>"


def _overall(doc: Mapping[str, Any], names: list[str]) -> str:
    tiers = sorted({t for n in names for t in doc[n]["tiers"]})
    head = "<tr><th>tier</th>" + "".join(f"<th>{n} share</th><th>{n} $</th><th>{n} p50 ms</th><th>{n} p99 ms</th>"
                                         for n in names) + "</tr>"
    rows = [head]
    for tier in tiers:
        cells = "".join(_cells(doc[n]["tiers"].get(tier, {})) for n in names)
        rows.append(f"<tr><td>{escape(tier)}</td>{cells}</tr>")
    total = "".join(f"<td>{doc[n]['requests']}</td><td>{doc[n]['cost_usd']:.4f}</td><td>{_ms(doc[n]['ttft_p50_ms'])}"
                    f"</td><td>{_ms(doc[n]['ttft_p99_ms'])}</td>" for n in names)
    rows.append(f"<tr><th>total</th>{total}</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _cells(tier: Mapping[str, Any]) -> str:
    return (f"<td>{100 * tier.get('share', 0):.2f}%</td><td>{tier.get('cost_usd', 0):.4f}</td>"
            f"<td>{_ms(tier.get('ttft_p50_ms'))}</td><td>{_ms(tier.get('ttft_p99_ms'))}</td>")


def _calibration(cal: Mapping[str, Any]) -> str:
    rows = ["<tr><th>tier</th><th>share (points)</th><th>cost</th><th>TTFT p50</th><th>TTFT p99</th></tr>"]
    for tier, e in cal["tiers"].items():
        rows.append(f"<tr><td>{escape(tier)}</td><td>{e['share_points']:+.2f}</td><td>{_pct(e['cost'])}</td>"
                    f"<td>{_pct(e['ttft_p50'])}{_at(e.get('ttft_p50_at'))}</td>"
                    f"<td>{_pct(e['ttft_p99'])}{_at(e.get('ttft_p99_at'))}</td></tr>")
    rows.append(f"<tr><th>overall</th><td>{cal['max_share_points']:.2f} max</td><td>{_pct(cal['cost'])}</td>"
                f"<td>{_pct(cal['ttft_p50'])}{_at(cal.get('ttft_p50_at'))}</td>"
                f"<td>{_pct(cal['ttft_p99'])}{_at(cal.get('ttft_p99_at'))}</td></tr>")
    return ("<table>" + "".join(rows) + "</table><p>Read each candidate figure with these errors around it. In "
            "brackets, where the replayed figure falls among the recorded TTFTs (their percentile at it): a p50 "
            "replayed at the 48th percentile of a log whose median lies in a gap can be 10 % off in milliseconds."
            "</p>")


def _at(quantile: float | None) -> str:
    """' (at the recorded 47.6th percentile)', or nothing without it."""
    return "" if quantile is None else f" (at the recorded {100 * quantile:.1f}th percentile)"


def _ttft_chart(tallies: Mapping[str, Tally], names: list[str]) -> str:
    series = {}
    for n in names:
        if tallies[n].ttft_quantile(0.5) is not None:
            series[n] = [(q, float(tallies[n].ttft_quantile(q / 100) or 0.0)) for q in range(1, 100)]
    return svg.lines("TTFT distribution in the window (ms by percentile, answered cache misses)", series, " ms",
                     "percentile")


def _burn(tallies: Mapping[str, Tally], names: list[str], candidate: GatewayConfig) -> list[str]:
    """Each budgeted tenant's cumulative spend through its dearest day, against its budget."""
    out = []
    budgets = {t.name: t.daily_budget_usd for t in candidate.tenants_by_key_hash.values() if t.daily_budget_usd}
    for tenant, budget in sorted(budgets.items()):
        per_day: dict[int, float] = defaultdict(float)
        for (name, hour), usd in tallies["candidate"].spend_hour.items():
            if name == tenant:
                per_day[hour // 24] += usd
        if not per_day:
            continue
        day = max(per_day, key=per_day.__getitem__)
        series: dict[str, list[tuple[float, float]]] = {}
        for n in names:
            total, points = 0.0, []
            for hour in range(day * 24, day * 24 + 24):
                total += tallies[n].spend_hour.get((tenant, hour), 0.0)
                points.append((float(hour - day * 24 + 1), total))
            series[n] = points
        series["budget"] = [(1.0, budget), (24.0, budget)]
        when = datetime.fromtimestamp(day * 86400, UTC).date().isoformat()
        out.append(svg.lines(f"Budget burn-down: {tenant} on {when} (cumulative USD by hour; budget {budget})",
                             series, "$", "hour"))
    return out


def _tenants(doc: Mapping[str, Any], names: list[str]) -> str:
    tenants = sorted({t for n in names for t in doc[n]["tenants"]})
    head = "<tr><th>tenant</th>" + "".join(f"<th>{n} req</th><th>{n} $</th><th>{n} refused</th>"
                                           f"<th>{n} p50</th><th>{n} p99</th>" for n in names) + "</tr>"
    rows = [head]
    for tenant in tenants:
        cells = ""
        for n in names:
            t = doc[n]["tenants"].get(tenant, {})
            cells += (f"<td>{t.get('requests', 0)}</td><td>{t.get('cost_usd', 0):.4f}</td><td>{t.get('refused', 0)}"
                      f"</td><td>{_ms(t.get('ttft_p50_ms'))}</td><td>{_ms(t.get('ttft_p99_ms'))}</td>")
        rows.append(f"<tr><td>{escape(tenant)}</td>{cells}</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _meta_line(meta: Mapping[str, Any]) -> str:
    window = meta.get("window", {})
    return (f"{meta.get('requests', 0)} logged requests ({meta.get('price_only', 0)} replayed for price only); "
            f"latency window: {window.get('sampled', '')}{_replays(meta)}. "
            f"Not modelled: {meta.get('not_modelled', '')}. "
            f"{NONE} is the tier of requests refused.")


def _replays(meta: Mapping[str, Any]) -> str:
    """How many times the window was replayed, when more than once (`simulate` module docstring)."""
    count = meta.get("replays", 1)
    return (f"; replayed {count} times, the fit's estimates drawn from their bootstrap (TTFT quantiles: the median "
            "of the replays')") if count > 1 else ""


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"
