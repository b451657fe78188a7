"""The dashboard's rolling window and the JSON computed from it, with a fake clock."""

from __future__ import annotations

import pytest

from gateway.context import RequestContext
from gateway.dashboard.snapshot import snapshot
from gateway.dashboard.window import BIN_RATIO, SLOT_S, SLOTS, LiveWindow, latency_bin, meets_slo, percentile_s
from gateway.testing import gateway_config, tier

CONFIG = gateway_config([tier("small", ["http://127.0.0.1:9/v1"]), tier("large", ["http://127.0.0.1:9/v1"])],
                        policy={"ttft_slo_ms": 100})
TENANT = next(iter(CONFIG.tenants_by_key_hash.values()))
DAY_START = 1_763_856_000.0  # a UTC midnight


def request(tier_name: str | None, status: int = 200, error: str | None = None, difficulty: float | None = None,
            cost: float = 0.001) -> RequestContext:
    ctx = RequestContext("r", "chat", CONFIG, b"", None, 0.0, 0.0)
    ctx.route.tier = CONFIG.tiers[tier_name] if tier_name else None
    ctx.tenant, ctx.result.status, ctx.result.error, ctx.route.difficulty, ctx.result.cost_usd = TENANT, status, error, difficulty, cost
    return ctx


def record(window: LiveWindow, ctx: RequestContext, ttft_s: float | None) -> None:
    window.record(ctx, ttft_s, 0.01, 0.002, meets_slo(ctx, ttft_s))


def test_percentiles_are_exact_to_within_a_bin() -> None:
    values = [0.001 * i for i in range(1, 1001)]  # 1 ms .. 1 s
    bins = [0] * 72
    for value in values:
        bins[latency_bin(value)] += 1
    for q, exact in ((0.5, 0.5), (0.99, 0.99)):
        found = percentile_s(bins, q)
        assert found is not None and exact / BIN_RATIO <= found <= exact * BIN_RATIO
    assert percentile_s([0] * 72, 0.5) is None


def test_the_snapshot_holds_series_summaries_refusals_and_tenants() -> None:
    now = [DAY_START + 3600]
    window = LiveWindow(clock=lambda: now[0])
    for i in range(30):
        record(window, request("small", difficulty=0.15), 0.05 if i % 3 else 0.5)  # a third miss the 100 ms SLO
        record(window, request("large", difficulty=0.85), 0.08)
    record(window, request("small", 503, "queue_full"), None)
    body = snapshot(window, CONFIG, {}, "up")
    assert body["tiers"] == ["large", "small"] and body["slos_ms"] == [100]
    small = body["summary"]["small"]
    assert (small["requests"], small["ok"]) == (31, 30) and small["goodput"] == pytest.approx(20 / 31, abs=1e-4)
    assert 40 < small["ttft_p50_ms"] < 60 and 400 < small["ttft_p99_ms"] < 600
    assert body["series"]["small"]["rps"]["200"][-1] == 30 / SLOT_S and len(body["times"]) == SLOTS
    assert body["refusals"] == {"queue_full": [0.0] * (SLOTS - 1) + [1 / SLOT_S]}
    assert body["difficulty"][1] == 30 and body["difficulty"][8] == 30
    assert body["tenants"] == [{"tenant": TENANT.name, "requests": 61, "cost_usd": 0.061, "saved_usd": 0.122}]


def test_slots_older_than_15_minutes_and_yesterdays_costs_drop_out() -> None:
    now = [DAY_START - 60]
    window = LiveWindow(clock=lambda: now[0])
    record(window, request("small"), 0.05)
    now[0] = DAY_START + SLOT_S * SLOTS  # 15 minutes and a day boundary later
    record(window, request("large"), 0.05)
    body = snapshot(window, CONFIG, {}, "off")
    assert body["tiers"] == ["large"] and body["tenants"][0]["requests"] == 1
