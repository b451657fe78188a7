"""bench/req_per_core.py's ratios: the issue-23 ones, and before / after in the same run (issue 37)."""

from __future__ import annotations

from typing import Any

from gateway.bench.per_core import ratios


def _row(proxy: str, reps: list[float], workload: str = "chat") -> dict[str, Any]:
    return {"workload": workload, "proxy": proxy, "per_core": sum(reps) / len(reps), "per_core_reps": reps}


def test_each_gateway_is_compared_with_every_variant_after_it_whole_and_repetition_by_repetition() -> None:
    rows = [_row("bare proxy", [8000, 8000]), _row("gateway", [6000, 6600]),
            _row("gateway (no replay fields)", [6000, 6000]), _row("gateway (b23c907)", [7500, 6000])]
    found = ratios(rows, 25.0)
    assert found["chat: gateway / bare proxy, req/s per core"] == "0.79x (6300 vs 8000)"
    assert found["chat: gateway / gateway (no replay fields), req/s per core"] == (
        "1.050x (6300 vs 6000); per repetition 1.000 / 1.100")
    assert found["chat: gateway / gateway (b23c907), req/s per core"] == (
        "0.933x (6300 vs 6750); per repetition 0.800 / 1.100")
    assert found["chat: gateway (no replay fields) / gateway (b23c907), req/s per core"] == (
        "0.889x (6000 vs 6750); per repetition 0.800 / 1.000")
    assert not any("bare proxy /" in name or "/ gateway, " in name for name in found)


def test_without_variants_only_the_issue_23_ratios() -> None:
    rows = [_row("bare proxy", [8000]), _row("gateway", [6000]), _row("LiteLLM", [200])]
    assert set(ratios(rows, 25.0)) == {"chat: gateway / bare proxy, req/s per core",
                                       "chat: gateway / LiteLLM, req/s per core (target ≥ 25x)"}
