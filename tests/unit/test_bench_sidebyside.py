"""gateway.bench.sidebyside: added-latency rows and the rate search's bracketing and bisection."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.bench.runner import Target
from gateway.bench.sidebyside import BenchPath, RateSearch, added_row, passes

PATH = BenchPath("p", Target("http://127.0.0.1:9/v1", "m"), 1)


class FakeSearch(RateSearch):
    """Probes answered by a formula instead of load: added p99 = `slope` x rate, direct saturating at `wall`."""

    def __init__(self, slope: float, wall: float = 1e9) -> None:
        super().__init__(PATH, [], 1.0, 10.0, lambda _: None, {})
        self.slope, self.wall = slope, wall
        self.asked: list[float] = []

    async def row(self, path: BenchPath, rate: float) -> dict[str, Any]:
        self.asked.append(rate)
        added = self.slope * rate
        return {"added_ttft_p99": added, "added_e2e_p99": added / 2, "failed": 0, "completed": 10,
                "direct_failed": 0, "direct_p99_ttft_ms": 15.0 if rate < self.wall else 500.0}


async def test_doubles_then_bisects() -> None:
    s = FakeSearch(slope=10 / 150)  # p99 added reaches 10 ms at 150 req/s
    found = await s.run(PATH, start=20, max_rate=10_000, slo_ms=10, bisect=3)
    assert s.asked[:4] == [20, 40, 80, 160] and len(s.asked) == 7
    assert 113 < found["rate"] <= 150 < found["first_over"] <= 160 and not found["capped"]


async def test_searches_below_the_start_rate_and_reports_none() -> None:
    low = await FakeSearch(slope=10 / 6).run(PATH, start=20, max_rate=1000, slo_ms=10, bisect=1)
    assert low["rate"] == 5.0 and low["first_over"] == pytest.approx(50 ** 0.5)  # 20, 10 over; 5 ok; 7.07 over
    never = FakeSearch(slope=100)
    found = await never.run(PATH, start=20, max_rate=1000, slo_ms=10, bisect=2)
    assert found["rate"] == 0.0 and never.asked == [20, 10, 5, 2.5, 1.25]


async def test_stops_when_direct_degrades_or_at_max_rate() -> None:
    walled = await FakeSearch(slope=0.001, wall=300).run(PATH, start=20, max_rate=10_000, slo_ms=10, bisect=3)
    assert walled["rate"] == 160 and walled["capped"] == "direct degraded at 320 req/s"
    capped = await FakeSearch(slope=0.001).run(PATH, start=20, max_rate=100, slo_ms=10, bisect=3)
    assert capped["rate"] == 80 and capped["capped"] == "--max-rate 100"


def test_added_row_and_passes() -> None:
    s = {"median_ttft_ms": 12.0, "p99_ttft_ms": 30.0, "median_e2el_ms": 100.0, "p99_e2el_ms": 150.0}
    d = {"median_ttft_ms": 10.0, "p99_ttft_ms": 22.0, "median_e2el_ms": 99.0, "p99_e2el_ms": 149.0}
    row = added_row("x", s, d)
    assert row == {"path": "x", "added_ttft_p50": 2.0, "added_ttft_p99": 8.0, "added_e2e_p50": 1.0,
                   "added_e2e_p99": 1.0}
    assert passes(row | {"failed": 0, "completed": 5}, 10) and not passes(row | {"failed": 1, "completed": 5}, 10)
    assert not passes(row | {"failed": 0, "completed": 5}, 7.5)
