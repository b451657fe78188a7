"""LiveWindow: what this gateway served in the last 15 minutes, in 10-second slots, kept in process
for the dashboard (not scraped from /metrics). Recording a request is a few dict and list updates;
the dashboard's JSON is computed from the slots when asked (gateway.dashboard.snapshot).

Latencies go into log-spaced bins (each 19 % wider than the one before, 1 ms to about 3 min), so a
slot's p50/p99 is exact to within a bin, whatever the request rate, in constant memory."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.context import RequestContext

SLOT_S = 10
SLOTS = 90  # 15 minutes
BIN_BASE_S = 0.001
BIN_RATIO = 2 ** 0.25
LATENCY_BINS = 72
DIFFICULTY_BINS = 10
_LOG_RATIO = math.log(BIN_RATIO)
_log = math.log  # a global, not a module attribute, on the request path


def latency_bin(seconds: float) -> int:
    """The bin of a latency: 0 holds everything up to BIN_BASE_S * BIN_RATIO."""
    if seconds <= BIN_BASE_S:
        return 0
    index = int(_log(seconds / BIN_BASE_S) / _LOG_RATIO)
    return index if index < LATENCY_BINS else LATENCY_BINS - 1


def bin_value_s(index: int) -> float:
    """A bin's representative latency: its geometric middle."""
    return float(BIN_BASE_S * BIN_RATIO ** (index + 0.5))


def percentile_s(bins: list[int], q: float) -> float | None:
    """The q-quantile (0..1) of the latencies counted in `bins`; None when there are none."""
    total = sum(bins)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(bins):
        seen += count
        if seen >= rank and count:
            return bin_value_s(index)
    return bin_value_s(LATENCY_BINS - 1)


def meets_slo(ctx: RequestContext, ttft_s: float | None) -> bool:
    """Goodput's rule: served (200) with the first token within the tenant's TTFT SLO (none: served is met)."""
    slo_ms = ctx.tenant.ttft_slo_ms if ctx.tenant is not None else None
    return ctx.result.status == 200 and (slo_ms is None or (ttft_s is not None and ttft_s * 1000 <= slo_ms))


@dataclass(slots=True)
class TierSlot:
    statuses: Counter[int] = field(default_factory=Counter)
    ttft: list[int] = field(default_factory=lambda: [0] * LATENCY_BINS)
    tpot: list[int] = field(default_factory=lambda: [0] * LATENCY_BINS)
    good: int = 0  # served (200) within the tenant's TTFT SLO, or served when the tenant has none


@dataclass(slots=True)
class Slot:
    index: int  # seconds since the epoch // SLOT_S
    tiers: dict[str, TierSlot] = field(default_factory=dict)
    refusals: Counter[str] = field(default_factory=Counter)  # 429/503 by reason
    spills: Counter[str] = field(default_factory=Counter)  # 'from->to': requests spilled (gateway.routing.spill)
    cache: Counter[str] = field(default_factory=Counter)
    difficulty: list[int] = field(default_factory=lambda: [0] * DIFFICULTY_BINS)


@dataclass(slots=True)
class TenantDay:
    requests: int = 0
    cost_usd: float = 0.0
    saved_usd: float = 0.0


class LiveWindow:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.slots: deque[Slot] = deque(maxlen=SLOTS)
        self.day: date | None = None
        self.tenants: dict[str, TenantDay] = {}
        self._day_ends = 0.0

    def record(self, ctx: RequestContext, ttft_s: float | None, tpot_s: float | None, saved_usd: float,
               good: bool) -> None:
        """Count one finished request (called by the account stage, for every request)."""
        now = self.clock()
        index = int(now // SLOT_S)
        slots = self.slots
        slot = slots[-1] if slots and slots[-1].index == index else self._open(index)
        name = ctx.route.tier.name if ctx.route.tier is not None else "none"
        tier = slot.tiers.get(name)
        if tier is None:
            tier = slot.tiers[name] = TierSlot()
        tier.statuses[ctx.result.status] += 1
        if ttft_s is not None:
            tier.ttft[latency_bin(ttft_s)] += 1
        if tpot_s is not None:
            tier.tpot[latency_bin(tpot_s)] += 1
        if good:
            tier.good += 1
        if ctx.result.status in (429, 503):
            slot.refusals[ctx.result.error or "overloaded"] += 1
        slot.cache[ctx.cache] += 1
        if ctx.route.spill is not None and ctx.route.spill.target is not None:
            slot.spills[f"{ctx.route.spill.chosen.tier.name}->{ctx.route.spill.tier.name}"] += 1
        if ctx.route.difficulty is not None:
            slot.difficulty[min(DIFFICULTY_BINS - 1, int(ctx.route.difficulty * DIFFICULTY_BINS))] += 1
        self._book(ctx.tenant_name, now, ctx.result.cost_usd, saved_usd)

    def _open(self, index: int) -> Slot:
        slot = Slot(index)
        self.slots.append(slot)
        return slot

    def _book(self, tenant: str, now: float, cost_usd: float, saved_usd: float) -> None:
        """Today's (UTC) requests, cost and savings of a tenant; a new day starts from zero."""
        if now >= self._day_ends:
            self.day, self.tenants = datetime.fromtimestamp(now, UTC).date(), {}
            self._day_ends = (now // 86400 + 1) * 86400
        booked = self.tenants.get(tenant)
        if booked is None:
            booked = self.tenants[tenant] = TenantDay()
        booked.requests += 1
        booked.cost_usd += cost_usd
        booked.saved_usd += saved_usd

    def recent(self) -> list[Slot]:
        """The slots of the last 15 minutes, oldest first (the deque may still hold older ones when idle)."""
        first = int(self.clock() // SLOT_S) - SLOTS + 1
        return [slot for slot in self.slots if slot.index >= first]
