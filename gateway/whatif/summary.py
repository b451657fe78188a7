"""Per scenario (recorded, baseline, candidate): requests, tier shares, costs, refusals, by tenant, tier, day and
hour, with bounded memory (sums and counters; TTFTs in quantile sketches, filled by the fleet simulation).

A simulated scenario's window is replayed by an ensemble (`simulate.simulate_ensemble`): its sketches pool every
replay's TTFTs (the distribution the HTML chart draws from), and each replay's own tally is kept (`Tally.replays`):
a TTFT p50 or p99 (overall, of a tier, of a tenant) is the median over the replays of each replay's own. That is the
figure one run's window shows, as the fit's uncertainty spreads it; the pooled sketch's p99 is the mixture's, whose
tail the few replays with the longest queues fill, above what a typical replay (and a run) shows.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from gateway.accounting.quantiles import QuantileSketch

NONE = "(none)"  # the tier of a request refused before routing


@dataclass(slots=True)
class Cell:
    requests: int = 0
    cost: float = 0.0
    refused: int = 0


@dataclass(slots=True)
class Tally:
    """One scenario's figures (see the module docstring)."""

    requests: int = 0
    cost: float = 0.0
    tiers: dict[str, Cell] = field(default_factory=lambda: defaultdict(Cell))
    tenants: dict[str, Cell] = field(default_factory=lambda: defaultdict(Cell))
    tenant_tiers: dict[tuple[str, str], Cell] = field(default_factory=lambda: defaultdict(Cell))
    refused: Counter[str] = field(default_factory=Counter)
    tenant_refused: Counter[tuple[str, str]] = field(default_factory=Counter)
    cache_hits: int = 0
    by_day: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # cost per UTC day
    by_hour: dict[tuple[int, str], int] = field(default_factory=lambda: defaultdict(int))  # (hour, tier) -> requests
    spend_hour: dict[tuple[str, int], float] = field(default_factory=lambda: defaultdict(float))  # (tenant, hour)
    ttft: dict[str, QuantileSketch] = field(default_factory=lambda: defaultdict(QuantileSketch))  # per tier, window
    tenant_ttft: dict[str, QuantileSketch] = field(default_factory=lambda: defaultdict(QuantileSketch))
    shed: Counter[str] = field(default_factory=Counter)  # refusals of the simulated window (admission)
    window_requests: int = 0
    overall_ttft: QuantileSketch = field(default_factory=QuantileSketch)
    exhausted: dict[tuple[str, str], float] = field(default_factory=dict)  # (tenant, day) -> budget used up at
    moved: Counter[str] = field(default_factory=Counter)  # requests spill moved ("spilled"), a session held ("held")
    replays: list[Tally] = field(default_factory=list)  # an ensemble's replays, each one's TTFTs (module docstring)

    def routed(self, spilled_from: str | None, session_route: str | None) -> None:
        """Count what spill and sessions did to a request's tier."""
        if spilled_from is not None:
            self.moved["spilled"] += 1
        if session_route == "held":
            self.moved["held"] += 1

    def add(self, tenant: str, tier: str | None, refused: str | None, cost: float, hour: int, day: str,
            hit: bool) -> None:
        name = tier if tier is not None and refused is None else NONE
        self.requests += 1
        self.cost += cost
        for cell in (self.tiers[name], self.tenants[tenant], self.tenant_tiers[(tenant, name)]):
            cell.requests += 1
            cell.cost += cost
            cell.refused += refused is not None
        if refused is not None:
            self.refused[refused] += 1
            self.tenant_refused[(tenant, refused)] += 1
        self.cache_hits += hit
        self.by_day[day] += cost
        self.by_hour[(hour, name)] += 1
        if cost:
            self.spend_hour[(tenant, hour)] += cost

    def figures(self) -> dict[str, Any]:
        """The JSON object `--json` writes for this scenario."""
        return {
            "requests": self.requests,
            "cost_usd": round(self.cost, 9),
            "tiers": {name: self._tier(name, cell) for name, cell in sorted(self.tiers.items())},
            "refused": dict(sorted((self.refused + self.shed).items())),
            "refused_in_window": dict(sorted(self.shed.items())),
            "cache_hits": self.cache_hits,
            "spilled": self.moved["spilled"], "held_by_session": self.moved["held"],
            **self._quantiles(),
            "window_requests": self.window_requests,
            "budgets_exhausted": {f"{tenant} {day}": at for (tenant, day), at in sorted(self.exhausted.items())},
            "tenants": {name: {"requests": c.requests, "cost_usd": round(c.cost, 9), "refused": c.refused,
                               "tiers": {t: {"requests": tc.requests, "cost_usd": round(tc.cost, 9)}
                                         for (n, t), tc in sorted(self.tenant_tiers.items()) if n == name},
                               **self._quantiles(tenant=name)}
                        for name, c in sorted(self.tenants.items())},
            "cost_by_day": {day: round(v, 9) for day, v in sorted(self.by_day.items())},
        }

    def _tier(self, name: str, cell: Cell) -> dict[str, Any]:
        return {"share": cell.requests / self.requests if self.requests else 0.0, "requests": cell.requests,
                "cost_usd": round(cell.cost, 9), **self._quantiles(tier=name)}

    def ttft_quantile(self, q: float, tier: str | None = None, tenant: str | None = None) -> float | None:
        """The TTFT q-quantile overall, of `tier` or of `tenant`: the median over the replays of each one's
        (`replays`), else this tally's; None without a TTFT."""
        each = [t._sketch(tier, tenant) for t in self.replays or [self]]
        values = [v for sketch in each if sketch is not None and len(sketch) and (v := sketch.quantile(q)) is not None]
        return median(values) if values else None

    def ttft_rank(self, ttft_ms: float | None, tier: str | None = None) -> float | None:
        """Where `ttft_ms` falls among this tally's TTFTs (overall, or `tier`'s): the q of which it is the
        q-quantile (`QuantileSketch.quantile_of`); None without either."""
        sketch = self._sketch(tier, None)
        return None if ttft_ms is None or sketch is None or not len(sketch) else sketch.quantile_of(ttft_ms)

    def _sketch(self, tier: str | None, tenant: str | None) -> QuantileSketch | None:
        if tier is not None:
            return self.ttft.get(tier)
        return self.overall_ttft if tenant is None else self.tenant_ttft.get(tenant)

    def _quantiles(self, tier: str | None = None, tenant: str | None = None) -> dict[str, float | None]:
        p50, p99 = (self.ttft_quantile(q, tier, tenant) for q in (0.5, 0.99))
        return {"ttft_p50_ms": None if p50 is None else round(p50, 3),
                "ttft_p99_ms": None if p99 is None else round(p99, 3)}
