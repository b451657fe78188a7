"""Small inline SVG charts for the HTML report: grouped bars, lines over time. No script, no CDN."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

COLORS = {"recorded": "#6b7280", "baseline": "#2563eb", "candidate": "#dc2626"}
PALETTE = ("#2563eb", "#16a34a", "#f59e0b", "#9333ea", "#dc2626", "#0891b2", "#6b7280", "#db2777")
W, H, PAD = 640, 220, 40


def _frame(title: str, body: str, legend: Mapping[str, str]) -> str:
    keys = "".join(f'<rect x="{PAD + i * 120}" y="4" width="10" height="10" fill="{c}"/>'
                   f'<text x="{PAD + 14 + i * 120}" y="13" font-size="11">{escape(k)}</text>'
                   for i, (k, c) in enumerate(legend.items()))
    return (f'<figure><figcaption>{escape(title)}</figcaption><svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{W}" height="{H + 30}" font-family="sans-serif">{keys}{body}</svg></figure>')


def _axis(top: float, unit: str) -> str:
    lines = []
    for i in range(5):
        y = 20 + H - 20 - (H - 40) * i / 4
        lines.append(f'<line x1="{PAD}" x2="{W - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>'
                     f'<text x="2" y="{y + 4:.1f}" font-size="10">{_num(top * i / 4)}{escape(unit)}</text>')
    return "".join(lines)


def bars(title: str, groups: Sequence[str], series: Mapping[str, Sequence[float]], unit: str = "") -> str:
    """Grouped bars: one group per label, one bar per series."""
    top = max([v for values in series.values() for v in values] + [1e-12])
    inner = (W - PAD - 10) / max(1, len(groups))
    width = inner * 0.8 / max(1, len(series))
    colors = {name: COLORS.get(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)}
    body = [_axis(top, unit)]
    for g, label in enumerate(groups):
        x0 = PAD + g * inner + inner * 0.1
        for s, (name, values) in enumerate(series.items()):
            v = values[g]
            h = (H - 40) * v / top
            body.append(f'<rect x="{x0 + s * width:.1f}" y="{20 + H - 20 - h:.1f}" width="{width:.1f}" '
                        f'height="{h:.1f}" fill="{colors[name]}"><title>{escape(name)} {escape(label)}: '
                        f'{_num(v)}{escape(unit)}</title></rect>')
        body.append(f'<text x="{x0:.1f}" y="{H + 14}" font-size="10">{escape(label[:14])}</text>')
    return _frame(title, "".join(body), colors)


def lines(title: str, series: Mapping[str, Sequence[tuple[float, float]]], unit: str = "", x_label: str = "") -> str:
    """Lines through (x, y) points, one per series."""
    points = [p for values in series.values() for p in values]
    if not points:
        return _frame(title, '<text x="40" y="60">no data</text>', {})
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_min, x_max, top = min(xs), max(xs), max(ys + [1e-12])
    span = (x_max - x_min) or 1.0
    colors = {name: COLORS.get(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)}
    body = [_axis(top, unit)]
    for name, values in series.items():
        path = " ".join(f"{PAD + (W - PAD - 10) * (x - x_min) / span:.1f},{20 + H - 20 - (H - 40) * y / top:.1f}"
                        for x, y in values)
        body.append(f'<polyline fill="none" stroke="{colors[name]}" stroke-width="2" points="{path}"/>')
    body.append(f'<text x="{PAD}" y="{H + 14}" font-size="10">{escape(x_label)} {_num(x_min)} .. {_num(x_max)}'
                f'</text>')
    return _frame(title, "".join(body), colors)


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"
