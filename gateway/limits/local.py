"""In-process limits: the same windows, per gateway process (what holds while Redis is down)."""

from __future__ import annotations

from collections import defaultdict

from gateway.limits.window import WindowPosition, retry_after, used


class LocalWindows:
    def __init__(self) -> None:
        self._counts: dict[tuple[str, int], float] = defaultdict(float)

    def admit(self, key: str, cost: float, limit: float, position: WindowPosition) -> float | None:
        """Charge `cost` if it fits under `limit`: None, else the seconds to wait."""
        current, previous = self._counts[(key, position.index)], self._counts.get((key, position.index - 1), 0.0)
        if used(current, previous, position) + cost > limit:
            return retry_after(current, previous, cost, limit, position)
        self._counts[(key, position.index)] = current + cost
        self._forget_before(position.index - 1)
        return None

    def adjust(self, key: str, delta: float, position: WindowPosition) -> None:
        self._counts[(key, position.index)] += delta

    def charge(self, costs: list[tuple[str, float]], position: WindowPosition) -> None:
        """Count what was admitted elsewhere (by Redis): the local windows then know this replica's use."""
        for key, cost in costs:
            self._counts[(key, position.index)] += cost
        self._forget_before(position.index - 1)

    def _forget_before(self, index: int) -> None:
        if len(self._counts) > 4096:
            for stale in [k for k in self._counts if k[1] < index]:
                del self._counts[stale]


class LocalBudgets:
    def __init__(self) -> None:
        self._spent: dict[tuple[str, str], float] = defaultdict(float)

    def spent(self, key: str, day: str) -> float:
        return self._spent.get((key, day), 0.0)

    def add(self, key: str, day: str, usd: float) -> None:
        self._spent[(key, day)] += usd
