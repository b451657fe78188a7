"""QuantileSketch: exact below its cap, within its relative error above, mergeable."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.accounting.quantiles import RELATIVE_ERROR, QuantileSketch

QS = (0.0, 0.01, 0.5, 0.95, 0.99, 1.0)


def _fill(values: np.ndarray, cap: int = 2048) -> QuantileSketch:
    sketch = QuantileSketch(exact_cap=cap)
    for v in values.tolist():
        sketch.add(v)
    return sketch


def test_exact_below_cap_matches_numpy() -> None:
    values = np.random.default_rng(1).lognormal(-7, 1.2, size=1500)
    sketch = _fill(values)
    assert sketch.exact and len(sketch) == 1500
    for q in QS:
        assert sketch.quantile(q) == pytest.approx(float(np.quantile(values, q)), rel=1e-12)


@pytest.mark.parametrize("seed", [2, 3])
def test_sketch_within_relative_error_of_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.lognormal(5, 1.0, size=60_000), np.zeros(500), rng.uniform(1, 5, size=3_000)])
    rng.shuffle(values)
    sketch = _fill(values, cap=1000)
    assert not sketch.exact and len(sketch) == len(values)
    for q in QS:
        got, want = sketch.quantile(q), float(np.quantile(values, q))
        assert got is not None
        assert abs(got - want) <= RELATIVE_ERROR * want + 1e-12, (q, got, want)


def test_merge_keeps_exactness_when_union_fits_and_accuracy_when_not() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.exponential(100, size=300), rng.exponential(300, size=400)
    merged = _fill(a)
    merged.merge(_fill(b))
    both = np.concatenate([a, b])
    assert merged.exact and merged.quantile(0.99) == pytest.approx(float(np.quantile(both, 0.99)))
    big = [rng.exponential(50, size=5000) for _ in range(4)]
    total = QuantileSketch(exact_cap=2048)
    for part in big:
        total.merge(_fill(part))
    every = np.concatenate(big)
    assert len(total) == 20_000
    for q in (0.5, 0.95, 0.99):
        want = float(np.quantile(every, q))
        assert abs((total.quantile(q) or 0) - want) <= RELATIVE_ERROR * want


def test_empty_and_bad_q() -> None:
    sketch = QuantileSketch()
    assert sketch.quantile(0.5) is None and len(sketch) == 0
    with pytest.raises(ValueError):
        sketch.quantile(1.5)
