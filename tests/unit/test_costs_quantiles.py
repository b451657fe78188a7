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


def test_quantile_of_inverts_quantile_exactly_below_the_cap_and_within_a_bucket_above() -> None:
    values = np.random.default_rng(5).lognormal(6, 0.8, size=1500)
    exact, bucketed = _fill(values), _fill(values, cap=100)
    for q in (0.0, 0.1, 0.476, 0.5, 0.9, 0.99, 1.0):
        assert exact.quantile_of(exact.quantile(q) or 0.0) == pytest.approx(q, abs=1e-9)
        # beyond the cap: the values below the bucket and half of it, against numpy's rank of the same value
        value = float(np.quantile(values, q))
        assert bucketed.quantile_of(value) == pytest.approx(float(np.mean(values < value)), abs=0.01)
    assert exact.quantile_of(float(values.min()) / 2) == 0.0 and exact.quantile_of(float(values.max()) * 2) == 1.0
    assert bucketed.quantile_of(float(values.max()) * 2) == pytest.approx(1.0, abs=0.001)
    crowded = _fill(np.concatenate([values, np.full(500, 300.0)]), cap=100)  # one bucket holding 500 values
    below = float(np.sum(values < 300.0 * (1 - RELATIVE_ERROR)))
    assert crowded.quantile_of(300.0) == pytest.approx((below + 250) / 2000, abs=0.004)  # half its own bucket


def test_quantile_of_a_run_of_equal_values_is_its_middle_and_of_nothing_none() -> None:
    sketch = _fill(np.array([1.0, 2.0, 2.0, 2.0, 5.0]))
    assert sketch.quantile_of(2.0) == 0.5 and sketch.quantile_of(3.5) == pytest.approx(0.875)
    assert sketch.quantile(0.875) == pytest.approx(3.5)
    assert QuantileSketch().quantile_of(1.0) is None
    assert _fill(np.array([4.0])).quantile_of(4.0) == 0.5
