"""The experiment report's rows as a text table, a CSV file and a PNG chart (matplotlib, the train extra)."""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from gateway.experiments.report import CORRECTION, METRICS, MIN_MEAN_N, MIN_TAIL, Collected, Row, comparisons

UNITS = {metric.name: metric.unit for metric in METRICS}
COLUMNS = ("experiment", "metric", "arm", "control", "n", "value", "ci_low", "ci_high", "diff_vs_control",
           "diff_ci_low", "diff_ci_high", "verdict", "p", "p_holm", "small_n")
MISSING = "--png needs matplotlib, which is not installed: pip install 'gateway[train]' (or pip install matplotlib)"


def number(value: float | None, unit: str, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    if unit == "ms":
        return f"{value:{sign},.1f}"
    if unit == "%":
        return f"{value:{sign}.1f}{'pp' if signed else '%'}"  # a difference of shares: percentage points
    if unit == "$":
        return f"{value:{sign},.4f}"
    return f"{value:{sign}.3f}"


def table(rows: Sequence[Row], collected: Collected) -> str:
    lines: list[str] = []
    header = f"{'metric':<12} {'arm':<16} {'n':>8}  {'value [95% CI]':<32} {'vs control [95% CI]':<34} verdict"
    for experiment in dict.fromkeys(row.experiment for row in rows):
        mine = [row for row in rows if row.experiment == experiment]
        control = next((row.arm for row in mine if row.control), None)
        data = collected.arms[experiment]
        shadow = sum(arm.shadow_cost for arm in data.values())
        lines += [f"Experiment {experiment}: control arm {control or '(none found: use --control ARM)'}"
                  + (f"; shadow cost ${shadow:.4g}" if shadow else ""),
                  f"Verdicts: {CORRECTION.format(m=comparisons(mine, experiment))}", header, "-" * len(header)]
        for row in mine:
            unit = UNITS.get(row.metric, "%")
            if row.metric == "requests":
                share = "-" if row.value is None else f"{100 * row.value:.1f}% of the experiment"
                lines.append(f"{'requests':<12} {row.arm:<16} {row.n:>8,}  {share}")
                continue
            value = f"{number(row.value, unit)} [{number(row.lo, unit)}, {number(row.hi, unit)}]"
            low, high = number(row.diff_lo, unit, True), number(row.diff_hi, unit, True)
            diff = "" if row.diff is None else f"{number(row.diff, unit, True)} [{low}, {high}]"
            verdict = f"{row.verdict} (small n)" if row.small_n and not row.control else row.verdict
            lines.append(f"{row.metric:<12} {row.arm:<16} {row.n:>8,}  {value:<32} {diff:<34} {verdict}")
        lines += _small_warning(mine)
        lines.append("")
    return "\n".join(lines)


def _small_warning(rows: Sequence[Row]) -> list[str]:
    small = [f"{row.metric} {row.arm}" for row in rows if row.small_n and not row.control]
    if not small:
        return []
    return [f"Warning: small samples ({', '.join(small)}): fewer than {MIN_MEAN_N} values for a mean or "
            f"{MIN_TAIL} beyond a percentile in the arm or the control; their figures and verdicts are fragile"]


def write_csv(rows: Sequence[Row], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(COLUMNS)
        for r in rows:
            out.writerow([r.experiment, r.metric, r.arm, int(r.control), r.n, *(_cell(v) for v in (
                r.value, r.lo, r.hi, r.diff, r.diff_lo, r.diff_hi)), r.verdict, _cell(r.p), _cell(r.p_holm),
                int(r.small_n)])


def _cell(value: float | None) -> str:
    return "" if value is None else repr(round(value, 9))


def missing_matplotlib() -> str | None:
    return MISSING if importlib.util.find_spec("matplotlib") is None else None


def draw(rows: Sequence[Row], path: Path) -> None:
    """One panel per metric and experiment: each arm's value with its 95 % interval; the verdict in the label."""
    from matplotlib.figure import Figure  # lazy: an optional dependency

    panels = list(dict.fromkeys((r.experiment, r.metric) for r in rows if r.metric != "requests"))
    cols = min(4, max(1, len(panels)))
    lines = max(1, -(-len(panels) // cols))
    fig = Figure(figsize=(3.6 * cols, 2.9 * lines), layout="constrained")
    for i, (experiment, metric) in enumerate(panels):
        ax = fig.add_subplot(lines, cols, i + 1)
        mine = [r for r in rows if r.experiment == experiment and r.metric == metric and r.value is not None]
        for x, r in enumerate(mine):
            value = r.value or 0.0
            low = value - r.lo if r.lo is not None else 0.0
            high = r.hi - value if r.hi is not None else 0.0
            color = "black" if r.control else {"better": "tab:green", "worse": "tab:red"}.get(r.verdict, "tab:blue")
            ax.errorbar([x], [value], yerr=[[max(low, 0.0)], [max(high, 0.0)]], fmt="o", color=color, capsize=4)
        ax.set_xticks(range(len(mine)), [f"{r.arm}\n({r.verdict})" if r.verdict else r.arm for r in mine],
                      fontsize="small")
        unit = UNITS.get(metric, "")
        ax.set_title(f"{experiment}: {metric}" + (f" ({unit})" if unit else ""), fontsize="medium")
        ax.margins(x=0.3)
    fig.savefig(path, format="png", dpi=110)
