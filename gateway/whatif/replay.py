"""One pass over the logs: every request decided and priced under each scenario, the latency window kept.

Requests are decided in arrival order (`records.in_arrival_order`: a line is written when its request ends, so
a slow request's line comes late; limits, budgets, sessions and the cache must see arrivals as they came).

Lines stream through one at a time; what is kept is bounded: the tallies (sums and counters), a reservoir of
measurements per tier (`physics.Samples`), and the window's requests. The window is the busiest UTC hour by
default (the hour with the most requests, found as the pass goes: only the current hour and the busiest so
far are held) or the one asked for; when it holds more than `max_window` requests, its busiest stretch of
`max_window` consecutive requests is simulated instead, and the report says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gateway.config import GatewayConfig
from gateway.whatif.decide import HITS, Decider, Decision
from gateway.whatif.physics import Samples
from gateway.whatif.records import SHED, LogStats, Logged, in_arrival_order, read_logged
from gateway.whatif.summary import Tally

MAX_WINDOW = 30_000
RECORDED = "recorded"


@dataclass(slots=True)
class Row:
    """A window request: the recorded figures and each scenario's decision."""

    rec: Logged
    decisions: dict[str, Decision]


@dataclass(slots=True)
class Window:
    start: float = 0.0
    end: float = 0.0
    rows: list[Row] = field(default_factory=list)
    hour_requests: int = 0  # requests of the whole hour (or asked window)
    sampled: str = "every request of the window"


@dataclass(slots=True)
class Replay:
    tallies: dict[str, Tally]
    stats: LogStats
    samples: dict[str, Samples]
    window: Window
    deciders: dict[str, Decider]


def replay(paths: Iterable[Path], scenarios: Mapping[str, GatewayConfig], *, window: tuple[float, float] | None = None,
           max_window: int = MAX_WINDOW) -> Replay:
    """Decide and price every request of `paths` under each scenario (see the module docstring)."""
    stats = LogStats()
    deciders = {name: Decider(config) for name, config in scenarios.items()}
    tallies = {name: Tally() for name in (RECORDED, *scenarios)}
    recorded = tallies[RECORDED]
    samples: dict[str, Samples] = {}
    best: list[Row] = []
    current: list[Row] = []
    current_hour = -1
    for rec in in_arrival_order(read_logged(paths, stats)):
        hour = int(rec.arrival // 3600)
        day = rec.day.isoformat()
        recorded.add(rec.tenant, rec.tier, rec.refused, rec.cost, hour, day, rec.cache in HITS)
        if rec.spilled_from is not None or rec.session_route == "held":
            recorded.routed(rec.spilled_from, rec.session_route)
        decisions = {}
        for name, decider in deciders.items():
            decision = decisions[name] = decider.decide(rec)
            tally = tallies[name]
            tally.add(rec.tenant, decision.tier, decision.refused, decision.cost, hour, day, decision.cache in HITS)
            if decision.spilled_from is not None or decision.session_route == "held":
                tally.routed(decision.spilled_from, decision.session_route)
        if rec.served and rec.stream and rec.tier is not None and rec.ttft_ms is not None and rec.cache not in HITS:
            tier_samples = samples.get(rec.tier)
            if tier_samples is None:
                tier_samples = samples[rec.tier] = Samples()
            tier_samples.add(rec.prompt - rec.cached, rec.ttft_ms, rec.tpot_ms)
        if window is not None:
            if window[0] <= rec.arrival < window[1]:
                best.append(Row(rec, decisions))
            continue
        if hour != current_hour:
            if len(current) > len(best):
                best = current
            current, current_hour = [], hour
        current.append(Row(rec, decisions))
    if window is None and len(current) > len(best):
        best = current
    for name, decider in deciders.items():
        tallies[name].exhausted = dict(decider.limits.exhausted)
    return Replay(tallies, stats, samples, _window(best, window, max_window), deciders)


def _window(rows: list[Row], asked: tuple[float, float] | None, max_window: int) -> Window:
    rows.sort(key=lambda row: row.rec.arrival)
    if not rows:
        return Window()
    if asked is not None:
        start, end = asked
    else:
        start = rows[0].rec.arrival // 3600 * 3600
        end = start + 3600
    total = len(rows)
    sampled = f"every request of the window ({total})"
    if total > max_window:
        spans = [rows[i + max_window - 1].rec.arrival - rows[i].rec.arrival for i in range(total - max_window + 1)]
        first = min(range(len(spans)), key=spans.__getitem__)
        rows = rows[first:first + max_window]
        start, end = rows[0].rec.arrival, rows[-1].rec.arrival
        sampled = (f"the busiest {max_window} consecutive requests of the window's {total} "
                   f"({(end - start) / 60:.1f} minutes): the fleet sees every request in that stretch")
    return Window(start, end, rows, total, sampled)


def shed_like(refused: str | None) -> bool:
    return refused is not None and refused in SHED
