"""The `--plot` chart: cost by tier per day as stacked bars, savings (routing + cache) hatched beside them.

matplotlib comes with the `train` extra; it is imported only here, only when a chart is asked for.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.accounting.aggregate import DailyCosts
from gateway.accounting.render import key_text, money_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MISSING = "--plot needs matplotlib, which is not installed: pip install 'gateway[train]' (or pip install matplotlib)"
WIDTH = 0.4
DPI = 110


def missing_matplotlib() -> str | None:
    """Why a chart cannot be drawn here, or None when matplotlib is importable."""
    return MISSING if importlib.util.find_spec("matplotlib") is None else None


def draw(daily: DailyCosts, path: Path) -> None:
    """Write a PNG: per UTC day, one bar of cost stacked by tier and one hatched bar of savings."""
    figure(daily).savefig(path, format="png", dpi=DPI)


def figure(daily: DailyCosts) -> Figure:
    """The chart, drawn in memory."""
    from matplotlib.figure import Figure  # lazy: an optional dependency
    from matplotlib.ticker import FuncFormatter

    days = sorted({day for day, _ in daily.cost} | set(daily.cache) | set(daily.routing))
    tiers = sorted({tier for _, tier in daily.cost}, key=lambda t: (t is None, t or ""))
    x = [float(i) for i in range(len(days))]
    fig = Figure(figsize=(max(6.0, 1.1 * len(days) + 3), 4.8), layout="constrained")
    ax = fig.add_subplot()
    bottom = [0.0] * len(days)
    for tier in tiers:
        heights = [float(daily.cost.get((day, tier), 0)) for day in days]
        if not any(heights):
            continue
        ax.bar([i - WIDTH / 2 for i in x], heights, WIDTH, bottom=bottom, label=f"cost: {key_text(tier)}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    routing = [float(daily.routing.get(day, 0)) for day in days]
    cache = [float(daily.cache.get(day, 0)) for day in days]
    savings_x = [i + WIDTH / 2 for i in x]
    ax.bar(savings_x, routing, WIDTH, fill=False, hatch="//", edgecolor="tab:green", label="saved: routing")
    ax.bar(
        savings_x, cache, WIDTH, bottom=[max(r, 0.0) for r in routing],
        fill=False, hatch="xx", edgecolor="tab:purple", label="saved: cache",
    )  # fmt: skip
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(x, [day.isoformat() for day in days], rotation=30 if len(days) > 7 else 0)
    ax.set_ylabel("USD")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: money_text(value, 2)))  # 0.00001, not 1e-5
    # the figure's title, not the axes': the legend beside the axes leaves them narrower than this line
    fig.suptitle("Cost by tier per day (UTC), with savings from routing and cache")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
