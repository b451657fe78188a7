"""The report's two renderings: an aligned table for people, a CSV of raw numbers for spreadsheets."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import TextIO

from gateway.accounting.aggregate import GroupKey, GroupStats, KeyPart

Value = Decimal | int | float | None
NO_TIER = "(none)"
TOTAL = "TOTAL"


@dataclass(frozen=True, slots=True)
class Column:
    header: str  # in the table
    csv: str  # in the CSV header
    value: Callable[[GroupStats], Value]
    digits: int = 0  # decimals in the table (money: at least, more for the significant digits)
    csv_digits: int = 0  # decimals of float values in the CSV
    table: bool = True  # CSV-only columns say False
    money: bool = False  # USD: shown with SIGNIFICANT digits however small (a request can cost $0.000005)


def _q(attr: str, q: float) -> Callable[[GroupStats], Value]:
    return lambda g: getattr(g, attr).quantile(q)


COLUMNS = (
    Column("requests", "requests", lambda g: g.requests),
    Column("errors", "errors", lambda g: g.errors),
    Column("tok_in", "prompt_tokens", lambda g: g.prompt_tokens),
    Column("tok_out", "completion_tokens", lambda g: g.completion_tokens),
    Column("cost $", "cost_usd", lambda g: g.cost, 4, money=True),
    Column("p50 $/req", "cost_p50_usd", _q("cost_q", 0.50), 6, 9, money=True),
    Column("p95 $/req", "cost_p95_usd", _q("cost_q", 0.95), 6, 9, money=True),
    Column("p99 $/req", "cost_p99_usd", _q("cost_q", 0.99), 6, 9, money=True),
    Column("ttft p50 ms", "ttft_p50_ms", _q("ttft_q", 0.50), 1, 3),
    Column("ttft p99 ms", "ttft_p99_ms", _q("ttft_q", 0.99), 1, 3),
    Column("e2e p50 ms", "e2e_p50_ms", _q("e2e_q", 0.50), 1, 3),
    Column("e2e p99 ms", "e2e_p99_ms", _q("e2e_q", 0.99), 1, 3),
    Column("cache hits", "cache_hits", lambda g: g.cache_hits),
    Column("routing saved $", "routing_savings_usd", lambda g: g.routing_savings, 4, money=True),
    Column("cache saved $", "cache_savings_usd", lambda g: g.cache_savings, 4, money=True),
    Column("shadow $", "shadow_cost_usd", lambda g: g.shadow_cost, 4, money=True),
    Column("", "baseline_cost_usd", lambda g: g.baseline, table=False),
    Column("", "saved_usd", lambda g: g.saved, table=False),
    Column("", "unpriced_baseline", lambda g: g.unpriced_baseline, table=False),
    Column("", "shadow_calls", lambda g: g.shadow_calls, table=False),
    Column("", "spend_usd", lambda g: g.spend, table=False),
    # edge lines (dashboard, admin, static, count_tokens, unknown paths): not in `requests`; last, so the CSV's
    # earlier columns keep their places
    Column("other endpoints", "other_endpoint_requests", lambda g: g.other_requests),
)


def key_text(part: KeyPart) -> str:
    if part is None:
        return NO_TIER
    return part.isoformat() if isinstance(part, date) else part


def _total_key(dimensions: Sequence[str]) -> list[str]:
    return [TOTAL] + [""] * (len(dimensions) - 1)


SIGNIFICANT = 3
MAX_DECIMALS = 9  # the log's precision: a nano-dollar


def _cell(value: Value, digits: int, money: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return f"{value:,}"
    if money:
        return money_text(value, digits)
    return f"{value:,.{digits}f}"


def money_text(value: Decimal | float, digits: int) -> str:
    """At least `digits` decimals, and more until SIGNIFICANT digits show (up to a nano-dollar), trailing
    zeros beyond `digits` dropped: 12.3457, 0.0123, 0.000005 (not 0.0000); zero is 0."""
    if not value:
        return "0"
    leading = value.adjusted() if isinstance(value, Decimal) else math.floor(math.log10(abs(value)))
    decimals = min(MAX_DECIMALS, max(digits, SIGNIFICANT - 1 - leading))
    text = f"{value:,.{decimals}f}"
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction[:digits]}{fraction[digits:].rstrip('0')}" if fraction else whole


def _csv_cell(value: Value, column: Column) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return f"{value:.{column.csv_digits}f}"
    return str(value)


def table(dimensions: Sequence[str], rows: Sequence[tuple[GroupKey, GroupStats]], total: GroupStats) -> str:
    """Aligned columns: keys left, numbers right, a rule above the total row."""
    columns = [c for c in COLUMNS if c.table]
    header = [*dimensions, *(c.header for c in columns)]
    body = [[*map(key_text, key), *(_cell(c.value(g), c.digits, c.money) for c in columns)] for key, g in rows]
    last = [*_total_key(dimensions), *(_cell(c.value(total), c.digits, c.money) for c in columns)]
    widths = [max(len(r[i]) for r in [header, *body, last]) for i in range(len(header))]
    keys = len(dimensions)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < keys else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, body), rule, line(last)])


def write_csv(
    out: TextIO, dimensions: Sequence[str], rows: Sequence[tuple[GroupKey, GroupStats]], total: GroupStats
) -> None:
    """Header, one row per group, then the total row (TOTAL in the first key column)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*dimensions, *(c.csv for c in COLUMNS)])
    for key, g in rows:
        writer.writerow([*map(key_text, key), *(_csv_cell(c.value(g), c) for c in COLUMNS)])
    writer.writerow([*_total_key(dimensions), *(_csv_cell(c.value(total), c) for c in COLUMNS)])
