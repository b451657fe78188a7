"""How far a replay lands from what the log recorded: each figure's error, for `--calibrate` and the report.

Compared: a scenario (the baseline: the policy that produced the log) against the recorded figures. Shares
in points (percentage points of all requests), cost and counts as relative errors, TTFT p50 and p99 per tier
and overall as relative errors; each with the issue's target where it has one.

Beside each TTFT error, given the recorded TTFTs (`rank`): where the replayed figure falls among them
(`ttft_p50_at`, `ttft_p99_at`: the recorded distribution's quantile at the replayed p50 / p99, 0.5 / 0.99 when
exact). A log's TTFTs often leave a gap around their median (streamed first tokens below, whole or queued answers
above, a handful between): a p50 replayed at the recorded 48th percentile can then be 12 % from the recorded p50,
and 2 percentile points are what the relative error cannot show.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TARGETS = {"share_points": 0.0, "cost": 0.01, "ttft_p50": 0.10, "ttft_p99": 0.20}


Rank = Callable[[float | None, str | None], float | None]  # (a TTFT, a tier or None: overall) -> recorded quantile


def errors(recorded: dict[str, Any], replayed: dict[str, Any], rank: Rank | None = None) -> dict[str, Any]:
    """Each figure of `replayed` against `recorded` (both `Tally.figures()` objects); `rank`: where a TTFT falls
    among the recorded ones (`Tally.ttft_rank` of the recorded tally), for `ttft_p50_at` / `ttft_p99_at`."""
    tiers: dict[str, Any] = {}
    for name in sorted(set(recorded["tiers"]) | set(replayed["tiers"])):
        a, b = recorded["tiers"].get(name, {}), replayed["tiers"].get(name, {})
        tiers[name] = {
            "share_points": round(100 * (b.get("share", 0.0) - a.get("share", 0.0)), 3),
            "requests": b.get("requests", 0) - a.get("requests", 0),
            "cost": _relative(a.get("cost_usd"), b.get("cost_usd")),
            "ttft_p50": _relative(a.get("ttft_p50_ms"), b.get("ttft_p50_ms")),
            "ttft_p99": _relative(a.get("ttft_p99_ms"), b.get("ttft_p99_ms")),
            **_ranks(rank, b, name),
        }
    reasons = sorted(set(recorded["refused"]) | set(replayed["refused"]))
    return {
        "cost": _relative(recorded["cost_usd"], replayed["cost_usd"]),
        "ttft_p50": _relative(recorded["ttft_p50_ms"], replayed["ttft_p50_ms"]),
        "ttft_p99": _relative(recorded["ttft_p99_ms"], replayed["ttft_p99_ms"]),
        **_ranks(rank, replayed, None),
        "max_share_points": max((abs(t["share_points"]) for t in tiers.values()), default=0.0),
        "tiers": tiers,
        "refused": {r: {"recorded": recorded["refused"].get(r, 0), "replayed": replayed["refused"].get(r, 0),
                        "error": _relative(recorded["refused"].get(r, 0), replayed["refused"].get(r, 0))}
                    for r in reasons},
        "targets": TARGETS,
    }


def _ranks(rank: Rank | None, replayed: dict[str, Any], tier: str | None) -> dict[str, float | None]:
    if rank is None:
        return {}
    found = {f"ttft_{q}_at": rank(replayed.get(f"ttft_{q}_ms"), tier) for q in ("p50", "p99")}
    return {k: None if v is None else round(v, 4) for k, v in found.items()}


def _relative(recorded: float | None, replayed: float | None) -> float | None:
    """(replayed - recorded) / recorded; None when either is missing or the recorded figure is 0 (then 0
    only when both are 0)."""
    if recorded is None or replayed is None:
        return None
    if recorded == 0:
        return 0.0 if replayed == 0 else None
    return round((replayed - recorded) / recorded, 5)
