"""The sliding-window arithmetic and the in-process windows and budgets, pinned to exact numbers (issue 42:
mutants of gateway/limits/window.py and gateway/limits/local.py that the limiter's tests let survive).

A minute window counts the current fixed minute plus the previous one weighted by the share of it still
inside the last 60 s; `retry_after` is when `cost` more fits as that weight decays (else: the minute's end).
"""

from __future__ import annotations

import pytest

from gateway.limits.local import LocalBudgets, LocalWindows
from gateway.limits.window import WINDOW_S, WindowPosition, retry_after, used


def at(minute: int, second: float) -> WindowPosition:
    return WindowPosition.at(minute * WINDOW_S + second)


def test_the_position_is_the_minute_the_share_of_the_previous_one_and_the_seconds_left() -> None:
    position = WindowPosition.at(125.0)  # minute 2, 5 s in
    assert position.index == 2
    assert position.previous_weight == pytest.approx(55 / 60)
    assert position.seconds_left == pytest.approx(55.0)
    start = WindowPosition.at(120.0)
    assert (start.index, start.previous_weight, start.seconds_left) == (2, 1.0, 60.0)
    late = WindowPosition.at(45.0)  # minute 0, three quarters in
    assert (late.index, late.previous_weight, late.seconds_left) == (0, 0.25, 15.0)


def test_used_adds_the_previous_minute_at_its_weight() -> None:
    half = at(7, 30)
    assert used(3.0, 4.0, half) == 5.0
    assert used(3.0, 0.0, half) == 3.0


def test_retry_after_waits_until_the_previous_minute_has_decayed_enough() -> None:
    half = at(7, 30)  # weight 0.5, 30 s left
    # 20 now + 100 before at 0.5 = 70; one more against 60: 11 over, the previous minute sheds 100/60 a second
    assert retry_after(20.0, 100.0, 1.0, 60.0, half) == pytest.approx(11 / 100 * 60)
    # the previous minute's weighted share (50) cannot cover 51 over: wait for the minute to turn
    assert retry_after(60.0, 100.0, 1.0, 60.0, half) == pytest.approx(30.0)
    # 6 over with 10 * 0.5 = 5 left to decay: the minute's end, not 6 / 10 * 60 = 36 s
    assert retry_after(60.0, 10.0, 1.0, 60.0, half) == pytest.approx(30.0)


def test_retry_after_with_a_small_previous_minute() -> None:
    quarter = at(3, 15)  # weight 0.75, 45 s left
    # 59 + 1 * 0.75 + 1 = 60.75 against 60.5: 0.25 over, covered by the previous minute's 0.75
    assert retry_after(59.0, 1.0, 1.0, 60.5, quarter) == pytest.approx(15.0)


def test_retry_after_without_a_previous_minute_is_the_minute_end() -> None:
    half = at(7, 30)
    assert retry_after(60.0, 0.0, 1.0, 60.0, half) == pytest.approx(30.0)
    assert retry_after(0.0, 0.0, 1.0, 60.0, half) == pytest.approx(30.0)  # no division by an empty minute


def test_retry_after_is_at_least_one_second() -> None:
    half = at(7, 30)
    assert retry_after(11.0, 100.0, 1.0, 60.0, half) == pytest.approx(1.2)  # 2 over: 2 / 100 * 60
    assert retry_after(10.0, 100.0, 1.0, 60.0, half) == 1.0  # 1 over: 0.6 s, said as 1
    assert retry_after(5.0, 0.0, 1.0, 5.0, at(7, 58.5)) == pytest.approx(1.5)
    assert retry_after(5.0, 0.0, 1.0, 5.0, at(7, 59.5)) == 1.0


def test_local_windows_count_the_previous_minute_at_its_weight() -> None:
    windows = LocalWindows()
    for _ in range(10):
        assert windows.admit("a", 1, 10, at(9, 10)) is None
    assert windows.admit("a", 1, 10, at(9, 20)) == pytest.approx(40.0)  # full, nothing before: the minute's end
    half = at(10, 30)  # the previous minute's 10 count 5
    assert [windows.admit("a", 1, 10, half) for _ in range(5)] == [None] * 5
    assert windows.admit("a", 1, 10, half) == pytest.approx(6.0)  # 1 over: the previous 10 shed it in 6 s
    assert windows.admit("b", 1, 10, half) is None  # per key


def test_local_windows_refuse_without_charging() -> None:
    windows = LocalWindows()
    assert windows.admit("a", 8, 10, at(1, 0)) is None
    assert windows.admit("a", 3, 10, at(1, 1)) == pytest.approx(59.0)  # 11 > 10: wait for the minute's end
    assert windows.admit("a", 2, 10, at(1, 2)) is None  # the refused 3 were not charged


def test_adjust_corrects_the_current_minute() -> None:
    windows = LocalWindows()
    assert windows.admit("a", 10, 10, at(1, 0)) is None
    windows.adjust("a", -4, at(1, 5))  # 4 of the 10 tokens charged were not used
    assert windows.admit("a", 4, 10, at(1, 6)) is None
    assert windows.admit("a", 1, 10, at(1, 7)) is not None
    windows.adjust("a", -2, at(1, 8))
    windows.adjust("a", -1, at(1, 8))  # adjustments add up
    assert windows.admit("a", 3, 10, at(1, 9)) is None
    assert windows.admit("a", 1, 10, at(1, 9)) is not None


def test_charge_counts_what_was_admitted_elsewhere() -> None:
    windows = LocalWindows()
    windows.charge([("a:req", 3.0), ("a:tok", 50.0)], at(1, 0))
    windows.charge([("a:req", 2.0)], at(1, 1))
    assert windows.admit("a:req", 5, 10, at(1, 2)) is None
    assert windows.admit("a:req", 1, 10, at(1, 2)) is not None
    assert windows.admit("a:tok", 50, 100, at(1, 2)) is None
    assert windows.admit("a:tok", 1, 100, at(1, 2)) is not None


def fill_stale(windows: LocalWindows, count: int, minute: int) -> None:
    windows.charge([(f"stale{i}", 1.0) for i in range(count)], at(minute, 0))


@pytest.mark.parametrize("through", ["admit", "charge"])
def test_past_4096_windows_those_before_the_previous_minute_are_forgotten(through: str) -> None:
    windows = LocalWindows()
    windows.charge([("a", 10.0)], at(9, 0))  # the previous minute of minute 10: must stay
    fill_stale(windows, 4094, 8)  # two minutes back: forgotten once there are more than 4096
    if through == "admit":
        assert windows.admit("a", 0, 10, at(10, 30)) is None  # a@9, a@10 and 4094 stale: 4096, none forgotten
        assert len(windows._counts) == 4096
        assert windows.admit("b", 0, 10, at(10, 30)) is None  # the 4097th
    else:
        windows.charge([("a", 0.0)], at(10, 30))
        assert len(windows._counts) == 4096
        windows.charge([("b", 0.0)], at(10, 30))
    assert sorted(windows._counts) == [("a", 9), ("a", 10), ("b", 10)]
    half = at(10, 30)  # the previous minute still weighs 10 * 0.5
    assert [windows.admit("a", 1, 10, half) for _ in range(5)] == [None] * 5
    assert windows.admit("a", 1, 10, half) is not None


def test_budgets_add_up_per_key_and_day() -> None:
    budgets = LocalBudgets()
    assert budgets.spent("a", "2026-01-01") == 0.0
    budgets.add("a", "2026-01-01", 0.25)
    budgets.add("a", "2026-01-01", 0.5)
    budgets.add("a", "2026-01-02", 2.0)
    budgets.add("b", "2026-01-01", 1.0)
    assert budgets.spent("a", "2026-01-01") == 0.75
    assert budgets.spent("a", "2026-01-02") == 2.0
    assert budgets.spent("b", "2026-01-01") == 1.0
    assert budgets.spent("b", "2026-01-02") == 0.0
