"""UTC days and timestamps for the request path, formatted once per day (or second), not per request."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from functools import lru_cache

DAY_S = 86400
_MILLIS = tuple(f".{ms:03d}+00:00" for ms in range(1000))  # the end of every timestamp, made once
_modf = math.modf


@lru_cache(maxsize=4)
def _day(index: int) -> tuple[date, str]:
    day = datetime.fromtimestamp(index * DAY_S, UTC).date()
    return day, day.strftime("%Y%m%d")


@lru_cache(maxsize=8)
def _second(whole: int) -> str:
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def utc_day(ts: float) -> date:
    """The UTC day of the Unix time `ts`."""
    return _day(int(ts // DAY_S))[0]


def day_key(ts: float) -> str:
    """The UTC day of `ts` as YYYYMMDD (Redis key suffixes)."""
    return _day(int(ts // DAY_S))[1]


def iso_ms(ts: float) -> str:
    """`ts` as ISO 8601 in UTC with milliseconds, as datetime.isoformat(timespec="milliseconds") writes it."""
    fraction, whole = _modf(ts)
    micros = round(fraction * 1e6)  # as datetime.fromtimestamp rounds
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    return _second(int(whole)) + _MILLIS[micros // 1000]
