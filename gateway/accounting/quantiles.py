"""Percentiles in bounded memory: exact up to `exact_cap` values, a log-bucket sketch beyond.

The sketch is DDSketch-like: a value v > 0 lands in bucket k = ceil(log_gamma(v)), which covers
(gamma^(k-1), gamma^k] and is reported as 2 gamma^k / (gamma + 1). Any value in the bucket is then
within a relative error alpha = (gamma - 1) / (gamma + 1) of the reported one (0.5% by default),
whatever the distribution; zeros are counted apart and are exact. Counts live in a dense numpy
array indexed by bucket, so memory grows with log(max / min), never with the number of values
(~1,400 buckets, ~11 KB, for values spanning 6 decades). Values arrive in a float buffer that is flushed into
the buckets, vectorised, each time it fills: while a sketch never flushed, percentiles are exact
(numpy's linear interpolation over the values themselves).
"""

from __future__ import annotations

import math
from array import array

import numpy as np
import numpy.typing as npt

EXACT_CAP = 2048
RELATIVE_ERROR = 0.005


class QuantileSketch:
    """Non-negative values in; percentiles out, exact while few, within RELATIVE_ERROR beyond."""

    __slots__ = ("_buffer", "_cap", "_counts", "_offset", "_zeros", "_min", "_max", "_flushed", "_log_gamma")

    def __init__(self, exact_cap: int = EXACT_CAP, relative_error: float = RELATIVE_ERROR) -> None:
        if exact_cap < 1 or not 0 < relative_error < 1:
            raise ValueError("exact_cap must be >= 1 and relative_error in (0, 1)")
        self._buffer = array("d")
        self._cap = exact_cap
        self._log_gamma = math.log((1 + relative_error) / (1 - relative_error))
        self._counts: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._offset = 0  # bucket index of _counts[0]
        self._zeros = 0
        self._min = math.inf
        self._max = -math.inf
        self._flushed = False

    def __len__(self) -> int:
        return len(self._buffer) + self._zeros + int(self._counts.sum())

    @property
    def exact(self) -> bool:
        """True while every value is still held, so percentiles are exact."""
        return not self._flushed

    def add(self, value: float) -> None:
        """Record one value (>= 0; the reader rejects negative latencies and costs)."""
        buffer = self._buffer
        buffer.append(value)
        if len(buffer) >= self._cap:
            self._flush()

    def merge(self, other: QuantileSketch) -> None:
        """Fold `other` (same relative error) into this sketch; exact if the union fits the cap."""
        if other._flushed:
            self._add_buckets(other._counts, other._offset)
            self._zeros += other._zeros
            self._min, self._max = min(self._min, other._min), max(self._max, other._max)
            self._flushed = True
        for start in range(0, len(other._buffer), self._cap):
            self._buffer.extend(other._buffer[start : start + self._cap])
            if len(self._buffer) >= self._cap:
                self._flush()
        if self._flushed and self._buffer:
            self._flush()

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1), numpy-style linear interpolation between ranks; None if empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"q must be in [0, 1], got {q}")
        if not self._flushed:
            return float(np.quantile(np.frombuffer(self._buffer, dtype=np.float64), q)) if self._buffer else None
        if self._buffer:
            self._flush()
        n = len(self)
        rank = q * (n - 1)
        low, high = math.floor(rank), math.ceil(rank)
        lo_value, hi_value = self._value_at(low), self._value_at(high)
        return lo_value + (hi_value - lo_value) * (rank - low)

    def quantile_of(self, value: float) -> float | None:
        """Where `value` falls among the values: the q whose `quantile(q)` is `value` (0 below the least, 1 above
        the greatest; the middle of a run of equal values), exact while the sketch is; beyond, from the buckets: the
        values of lower buckets, half of `value`'s own bucket and the zeros below it, over the count. None if empty."""
        if not self._flushed:
            values = np.sort(np.frombuffer(self._buffer, dtype=np.float64))
            if not len(values):
                return None
            if value < values[0] or value > values[-1]:
                return float(value > values[-1])
            if len(values) == 1:
                return 0.5
            below, through = int(np.searchsorted(values, value, "left")), int(np.searchsorted(values, value, "right"))
            if through > below:  # equal values: the middle of their ranks
                rank = (below + through - 1) / 2
            else:  # between values[below - 1] and values[below]: interpolated as `quantile` does
                low, high = values[below - 1], values[below]
                rank = below - 1 + (value - low) / (high - low)
            return float(rank / (len(values) - 1))
        if self._buffer:
            self._flush()
        n = len(self)
        if value <= 0:
            return self._zeros / 2 / n
        key = math.ceil(math.log(value) / self._log_gamma) - self._offset
        counts = self._counts
        lower = int(counts[:max(0, min(key, len(counts)))].sum())
        own = int(counts[key]) if 0 <= key < len(counts) else 0
        return (self._zeros + lower + own / 2) / n

    def _value_at(self, rank: int) -> float:
        if rank < self._zeros:
            return 0.0
        cumulative = np.cumsum(self._counts)
        index = int(np.searchsorted(cumulative, rank - self._zeros, side="right"))
        gamma = math.exp(self._log_gamma)
        value = 2 * gamma ** (index + self._offset) / (gamma + 1)
        return min(max(value, self._min), self._max)

    def _flush(self) -> None:
        values = np.frombuffer(self._buffer, dtype=np.float64)
        positive = values[values > 0]
        self._zeros += len(values) - len(positive)
        if len(values):
            self._min, self._max = min(self._min, float(values.min())), max(self._max, float(values.max()))
        if len(positive):
            keys = np.ceil(np.log(positive) / self._log_gamma).astype(np.int64)
            first = int(keys.min())
            self._add_buckets(np.bincount(keys - first).astype(np.int64), first)
        self._buffer = array("d")
        self._flushed = True

    def _add_buckets(self, counts: npt.NDArray[np.int64], offset: int) -> None:
        if not len(counts):
            return
        if not len(self._counts):
            self._counts, self._offset = counts.copy(), offset
            return
        start = min(self._offset, offset)
        end = max(self._offset + len(self._counts), offset + len(counts))
        merged = np.zeros(end - start, dtype=np.int64)
        merged[self._offset - start : self._offset - start + len(self._counts)] += self._counts
        merged[offset - start : offset - start + len(counts)] += counts
        self._counts, self._offset = merged, start
