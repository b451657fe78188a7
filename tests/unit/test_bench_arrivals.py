"""gateway.bench.arrivals: schedule statistics with a fixed seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.bench.arrivals import Arrivals, constant_offsets, offsets, offsets_within, poisson_offsets


def test_poisson_gaps_are_exponential_at_the_rate() -> None:
    t = poisson_offsets(20_001, rate=50.0, seed=7)
    gaps = np.diff(t)
    assert t[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1
    # memoryless: P(gap > 2 / rate) = e^-2
    assert (gaps > 2 / 50).mean() == pytest.approx(math.exp(-2), abs=0.01)
    # arrivals in 1 s windows are Poisson(50): variance == mean
    counts = np.bincount(np.asarray(t, dtype=int))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.2)


def test_burstiness_changes_the_spread_not_the_rate() -> None:
    regular = np.diff(poisson_offsets(20_001, 10.0, seed=1, burstiness=4.0))
    bursty = np.diff(poisson_offsets(20_001, 10.0, seed=1, burstiness=0.25))
    assert regular.mean() == pytest.approx(0.1, rel=0.03) and bursty.mean() == pytest.approx(0.1, rel=0.06)
    assert regular.std() / regular.mean() == pytest.approx(0.5, abs=0.03)  # gamma CV = 1 / sqrt(shape)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, abs=0.15)


def test_seeded_and_reproducible() -> None:
    assert poisson_offsets(100, 5.0, seed=3) == poisson_offsets(100, 5.0, seed=3)
    assert poisson_offsets(100, 5.0, seed=3) != poisson_offsets(100, 5.0, seed=4)


def test_constant_and_infinite_rates() -> None:
    assert constant_offsets(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert poisson_offsets(3, math.inf) == [0.0, 0.0, 0.0] == constant_offsets(3, math.inf)
    assert poisson_offsets(0, 1.0) == [] and offsets(Arrivals("constant", 4.0), 2) == [0.0, 0.25]
    with pytest.raises(ValueError):
        poisson_offsets(3, 0.0)
    with pytest.raises(ValueError):
        offsets(Arrivals("closed", concurrency=4), 3)


def test_offsets_within_a_duration() -> None:
    assert offsets_within(Arrivals("constant", 2.5), 3.0) == [0.0, 0.4, 0.8, 1.2, 1.6, 2.0, 2.4, 2.8]
    counts = [len(offsets_within(Arrivals("poisson", 20.0, seed=s), 5.0)) for s in range(200)]
    assert np.mean(counts) == pytest.approx(100, rel=0.03) and np.var(counts) == pytest.approx(100, rel=0.3)
    times = offsets_within(Arrivals("poisson", 20.0, seed=1), 5.0)
    assert times == poisson_offsets(len(times), 20.0, seed=1) and max(times) < 5.0
    assert Arrivals("closed", concurrency=8).label() == "concurrency 8"
    assert Arrivals("poisson", 2.0).label() == "poisson 2 req/s"
    with pytest.raises(ValueError):
        offsets_within(Arrivals("poisson"), 3.0)
