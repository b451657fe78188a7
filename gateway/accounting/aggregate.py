"""Per-group sums (exact `Decimal` money) and percentile sketches, and the per-day tier costs for the chart."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from decimal import Decimal
from operator import attrgetter
from typing import cast

from gateway.accounting.quantiles import QuantileSketch
from gateway.accounting.records import Record

DIMENSIONS = ("tenant", "tier", "day", "session")  # session: one chat end to end (issue 32)
KeyPart = str | date | None
GroupKey = tuple[KeyPart, ...]


class GroupStats:
    """Everything the report shows for one group; `merge` folds groups into the total."""

    __slots__ = (
        "requests", "errors", "prompt_tokens", "completion_tokens", "cache_hits", "unpriced_baseline",
        "cost", "avoided", "baseline", "saved", "routing_savings", "cost_q", "ttft_q", "e2e_q", "shadow_calls",
        "shadow_cost", "other_requests",
    )  # fmt: skip

    def __init__(self) -> None:
        self.requests = self.errors = self.prompt_tokens = self.completion_tokens = 0
        self.cache_hits = self.unpriced_baseline = self.shadow_calls = 0
        self.other_requests = 0  # edge lines: other endpoints than inference (dashboard, admin, ...), cost 0
        self.cost = self.avoided = self.baseline = self.saved = self.routing_savings = Decimal(0)
        self.shadow_cost = Decimal(0)  # shadow comparisons' reference and judge calls: the gateway's spend
        self.cost_q, self.ttft_q, self.e2e_q = QuantileSketch(), QuantileSketch(), QuantileSketch()

    @property
    def cache_savings(self) -> Decimal:
        """What cache hits would have cost on the tier that would have served them."""
        return self.avoided

    @property
    def spend(self) -> Decimal:
        """Everything the backends were paid for: the requests' cost and the shadow comparisons'."""
        return self.cost + self.shadow_cost

    def add(self, r: Record) -> None:
        if r.shadow_only:  # a shadow call: the gateway's spend, no request of the tenant's
            self.shadow_calls += 1
            self.shadow_cost += r.shadow
            return
        if r.edge:  # another endpoint (dashboard, admin, static, count_tokens, ...): no backend ran, counted apart
            self.other_requests += 1
            self.cost += r.cost  # 0 as logged; added all the same, so spend never drops a logged dollar
            return
        self.requests += 1
        self.prompt_tokens += r.prompt_tokens
        self.completion_tokens += r.completion_tokens
        self.cost += r.cost
        self.avoided += r.avoided
        self.baseline += r.baseline
        self.saved += r.saved
        if r.priced_baseline:
            self.routing_savings += r.saved - r.avoided
        else:
            self.unpriced_baseline += 1
        if r.cache_hit:
            self.cache_hits += 1
        if 200 <= r.status < 300:
            self.cost_q.add(float(r.cost))
            if r.ttft_ms is not None:
                self.ttft_q.add(r.ttft_ms)
            if r.e2e_ms is not None:
                self.e2e_q.add(r.e2e_ms)
        else:
            self.errors += 1

    def merge(self, other: GroupStats) -> None:
        for name in ("requests", "errors", "prompt_tokens", "completion_tokens", "cache_hits", "unpriced_baseline",
                     "shadow_calls", "other_requests"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("cost", "avoided", "baseline", "saved", "routing_savings", "shadow_cost"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.cost_q.merge(other.cost_q)
        self.ttft_q.merge(other.ttft_q)
        self.e2e_q.merge(other.e2e_q)


def key_function(dimensions: Sequence[str]) -> Callable[[Record], GroupKey]:
    """The group key of a record for the chosen dimensions (a subset of DIMENSIONS, in order)."""
    unknown = [d for d in dimensions if d not in DIMENSIONS]
    if unknown or not dimensions:
        raise ValueError(f"group by one or more of {', '.join(DIMENSIONS)}; got {', '.join(unknown) or 'nothing'}")
    if len(dimensions) == 1:
        one = attrgetter(dimensions[0])
        return lambda r: (one(r),)
    return cast(Callable[[Record], GroupKey], attrgetter(*dimensions))


class Grouped:
    """Records folded into one GroupStats per key."""

    def __init__(self, dimensions: Sequence[str]) -> None:
        self.dimensions = tuple(dimensions)
        self.groups: dict[GroupKey, GroupStats] = {}
        self._key = key_function(dimensions)

    def add(self, r: Record) -> None:
        key = self._key(r)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = GroupStats()
        group.add(r)

    def rows(self) -> list[tuple[GroupKey, GroupStats]]:
        """Groups sorted by key (days in order, the unrouted tier last)."""
        return sorted(self.groups.items(), key=lambda item: [(part is None, str(part)) for part in item[0]])

    def total(self) -> GroupStats:
        total = GroupStats()
        for group in self.groups.values():
            total.merge(group)
        return total


class DailyCosts:
    """Cost per (day, tier) and savings per day: what the chart draws."""

    def __init__(self) -> None:
        self.cost: defaultdict[tuple[date, str | None], Decimal] = defaultdict(Decimal)
        self.routing: defaultdict[date, Decimal] = defaultdict(Decimal)
        self.cache: defaultdict[date, Decimal] = defaultdict(Decimal)

    def add(self, r: Record) -> None:
        self.cost[r.day, r.tier] += r.cost + r.shadow  # spend: shadow comparisons' too
        self.cache[r.day] += r.avoided
        if r.priced_baseline:
            self.routing[r.day] += r.saved - r.avoided


def aggregate(records: Iterable[Record], grouped: Grouped, daily: DailyCosts | None = None) -> None:
    """Fold every record into `grouped` (and `daily`, when the chart is wanted)."""
    add = grouped.add
    if daily is None:
        for r in records:
            add(r)
        return
    add_daily = daily.add
    for r in records:
        add(r)
        add_daily(r)
