"""The dashboard's JSON: series over the last 15 minutes (one point per 10-second slot) and totals,
computed from a LiveWindow and the live admission gates when the page asks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gateway.admission.gate import TierGate
from gateway.config import GatewayConfig
from gateway.dashboard.window import DIFFICULTY_BINS, LATENCY_BINS, SLOT_S, SLOTS, LiveWindow, Slot, TierSlot, \
    percentile_s

HITS = ("hit", "semantic_hit")


def snapshot(window: LiveWindow, config: GatewayConfig, gates: Mapping[str, TierGate], redis: str) -> dict[str, Any]:
    slots = window.recent()
    last = int(window.clock() // SLOT_S)
    by_index = {slot.index: slot for slot in slots}
    timeline = [by_index.get(index) for index in range(last - SLOTS + 1, last + 1)]
    tiers = sorted({name for slot in slots for name in slot.tiers})
    slos = sorted({t.ttft_slo_ms for t in config.tenants_by_key_hash.values() if t.ttft_slo_ms is not None}
                  | ({config.policy.ttft_slo_ms} if config.policy.ttft_slo_ms is not None else set()))
    cache: Counter[str] = Counter()
    difficulty = [0] * DIFFICULTY_BINS
    for slot in slots:
        cache.update(slot.cache)
        difficulty = [a + b for a, b in zip(difficulty, slot.difficulty)]
    looked_up = sum(n for status, n in cache.items() if status in ("miss", *HITS))
    return {
        "now": window.clock(), "slot_s": SLOT_S, "window_s": SLOT_S * SLOTS,
        "times": [(last - SLOTS + 1 + i) * SLOT_S for i in range(SLOTS)],
        "tiers": tiers, "configured_tiers": list(config.tiers), "slos_ms": slos,
        "series": {name: _tier_series(timeline, name) for name in tiers},
        "goodput": [_goodput([s for s in slot.tiers.values()]) if slot else None for slot in timeline],
        "summary": {name: _tier_summary(slots, name) for name in tiers},
        "refusals": _refusals(timeline),
        "spills": _spills(timeline),
        "admission": {name: {"limit": gate.slots, "in_flight": gate.in_flight, "queued": len(gate.queue)}
                      for name, gate in sorted(gates.items())},
        "difficulty": difficulty,
        "cache": dict(cache), "cache_hit_ratio": sum(cache[h] for h in HITS) / looked_up if looked_up else None,
        "redis": redis,
        "day": window.day.isoformat() if window.day else None,
        "tenants": [{"tenant": name, "requests": day.requests, "cost_usd": round(day.cost_usd, 6),
                     "saved_usd": round(day.saved_usd, 6)} for name, day in sorted(window.tenants.items())],
    }


def _tier_series(timeline: list[Slot | None], name: str) -> dict[str, Any]:
    """Per slot: requests per second by status, TTFT and TPOT p50/p99 in ms (None: no data)."""
    cells = [slot.tiers.get(name) if slot else None for slot in timeline]
    statuses = sorted({status for cell in cells if cell for status in cell.statuses})
    return {
        "rps": {str(status): [cell.statuses[status] / SLOT_S if cell else 0.0 for cell in cells]
                for status in statuses},
        "ttft_p50_ms": [_ms(cell.ttft, 0.5) if cell else None for cell in cells],
        "ttft_p99_ms": [_ms(cell.ttft, 0.99) if cell else None for cell in cells],
        "tpot_p50_ms": [_ms(cell.tpot, 0.5) if cell else None for cell in cells],
        "tpot_p99_ms": [_ms(cell.tpot, 0.99) if cell else None for cell in cells],
    }


def _tier_summary(slots: list[Slot], name: str) -> dict[str, Any]:
    """A tier's 15 minutes in figures: requests, request rate, share of all requests, percentiles, goodput."""
    cells = [slot.tiers[name] for slot in slots if name in slot.tiers]
    everything = sum(sum(cell.statuses.values()) for slot in slots for cell in slot.tiers.values())
    requests = sum(sum(cell.statuses.values()) for cell in cells)
    ttft, tpot = _merged(cells, "ttft"), _merged(cells, "tpot")
    span_s = max(1, len(slots)) * SLOT_S
    return {
        "requests": requests, "rps": round(requests / span_s, 3),
        "ok": sum(cell.statuses[200] for cell in cells),
        "share": round(requests / everything, 4) if everything else 0.0,
        "ttft_p50_ms": _ms(ttft, 0.5), "ttft_p99_ms": _ms(ttft, 0.99),
        "tpot_p50_ms": _ms(tpot, 0.5), "tpot_p99_ms": _ms(tpot, 0.99),
        "goodput": _goodput(cells),
    }


def _merged(cells: list[TierSlot], which: str) -> list[int]:
    merged = [0] * LATENCY_BINS
    for cell in cells:
        merged = [a + b for a, b in zip(merged, getattr(cell, which))]
    return merged


def _goodput(cells: list[TierSlot]) -> float | None:
    total = sum(sum(cell.statuses.values()) for cell in cells)
    return round(sum(cell.good for cell in cells) / total, 4) if total else None


def _refusals(timeline: list[Slot | None]) -> dict[str, list[float]]:
    reasons = sorted({reason for slot in timeline if slot for reason in slot.refusals})
    return {reason: [slot.refusals[reason] / SLOT_S if slot else 0.0 for slot in timeline] for reason in reasons}


def _spills(timeline: list[Slot | None]) -> dict[str, list[float]]:
    """Requests per second spilled from one tier to another (issue 39), per slot."""
    moves = sorted({move for slot in timeline if slot for move in slot.spills})
    return {move: [slot.spills[move] / SLOT_S if slot else 0.0 for slot in timeline] for move in moves}


def _ms(bins: list[int], q: float) -> float | None:
    seconds = percentile_s(bins, q)
    return None if seconds is None else round(seconds * 1000, 2)
