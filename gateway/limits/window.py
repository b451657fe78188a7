"""The sliding-window arithmetic shared by the Redis script and the local fallback.

A minute window is approximated by the current fixed minute plus the previous one weighted by the
share of it still inside the last 60 s (Cloudflare's sliding window counter): O(1) state, within a
few percent of an exact log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WINDOW_S = 60


@dataclass(frozen=True, slots=True)
class WindowPosition:
    index: int  # which fixed minute `now` is in
    previous_weight: float  # share of the previous minute still inside the sliding window
    seconds_left: float  # until the current minute ends

    @classmethod
    def at(cls, now: float) -> WindowPosition:
        index = math.floor(now / WINDOW_S)
        into = now - index * WINDOW_S
        return cls(index, 1.0 - into / WINDOW_S, WINDOW_S - into)


def used(current: float, previous: float, position: WindowPosition) -> float:
    return current + previous * position.previous_weight


def retry_after(current: float, previous: float, cost: float, limit: float, position: WindowPosition) -> float:
    """Seconds until `cost` more fits, as the previous minute's weight decays (else the window turns)."""
    excess = used(current, previous, position) + cost - limit
    if previous > 0 and excess <= previous * position.previous_weight:
        return max(1.0, excess / previous * WINDOW_S)
    return max(1.0, position.seconds_left)
