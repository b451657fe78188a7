"""gateway.bench.routing: PGR curves, APGR (random 0.5, oracle, hand-computed), cost per 1k requests."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.bench.routing import apgr, cost_per_1k, cpt, pgr_at, pgr_curve, random_apgr


def test_curve_by_hand() -> None:
    # gains 0.6, 0.3, 0.1; the router ranks them 2nd, 1st, 3rd
    share, pgr = pgr_curve([0.5, 0.9, 0.1], weak=[0.4, 0.7, 0.9], strong=[1.0, 1.0, 1.0])
    assert share.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 1])
    assert pgr.tolist() == pytest.approx([0, 0.3, 0.9, 1.0])
    # trapezoids of width 1/3: (0 + .3)/2 + (.3 + .9)/2 + (.9 + 1)/2, over 3
    assert apgr(share, pgr) == pytest.approx((0.15 + 0.6 + 0.95) / 3)


def test_oracle_beats_random_and_random_is_half() -> None:
    rng = np.random.default_rng(0)
    weak = rng.uniform(0, 1, 400)
    strong = np.ones(400)
    oracle = apgr(*pgr_curve(strong - weak, weak, strong))
    assert oracle == pytest.approx(2 / 3, abs=0.02)  # uniform gains, best first: 1 - (1 - x)^2 integrates to 2/3
    assert random_apgr(weak, strong, trials=300) == pytest.approx(0.5, abs=0.01)
    assert apgr(*pgr_curve(weak, weak, strong)) == pytest.approx(1 / 3, abs=0.02)  # worst order: 1 - oracle


def test_ties_share_their_gain() -> None:
    share, pgr = pgr_curve([1.0, 1.0], weak=[0.0, 1.0], strong=[1.0, 1.0])
    assert pgr.tolist() == pytest.approx([0.0, 0.5, 1.0])  # a constant score routes like random
    with pytest.raises(ValueError):
        pgr_curve([1.0], weak=[1.0], strong=[1.0])


def test_threshold_point_and_cost() -> None:
    assert pgr_at([0.2, 0.7, 0.9], [0.5, 0.5, 0.0], [1.0, 1.0, 1.0], cut=0.6) == pytest.approx((2 / 3, 0.75))
    # 1000 requests of (1e6 in, 0 out) tokens at $1 weak / $3 strong per Mtok input, half to strong
    assert cost_per_1k([1e6, 1e6], [0, 0], [False, True], (1.0, 0.0), (3.0, 0.0)) == pytest.approx(2000.0)
    assert cost_per_1k([100], [200], [True], (0.0, 0.0), (0.5, 2.0)) == pytest.approx(0.45)


def test_call_performance_threshold_by_hand() -> None:
    share, pgr = pgr_curve([0.5, 0.9, 0.1], weak=[0.4, 0.7, 0.9], strong=[1.0, 1.0, 1.0])  # PGR 0, .3, .9, 1
    assert cpt(share, pgr, 0.5) == pytest.approx(2 / 3)
    assert cpt(share, pgr, 0.3) == pytest.approx(1 / 3)
    assert cpt(share, pgr, 0.95) == pytest.approx(1.0)
    assert cpt(share, pgr, 0.0) == 0.0
