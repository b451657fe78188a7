"""Router metrics on measured outcomes (gateway.training.route_metrics): RouteLLM's decile APGR, CPT, intervals."""

import numpy as np
import pytest

from gateway.training.route_metrics import (
    apgr, bootstrap_indices, cpt, decile_curve, paired_difference, random_summary, share_for_quality, summarize,
)

RNG = np.random.default_rng(7)
WEAK = (RNG.random(2000) < 0.4).astype(float)
STRONG = np.maximum(WEAK, (RNG.random(2000) < 0.5).astype(float))
GAIN = STRONG - WEAK


def test_the_oracle_random_and_reversed_routers() -> None:
    assert apgr(GAIN, WEAK, STRONG) > 0.8  # 0/1 gains: the curve is linear from 0 to the gaining share
    assert apgr(-GAIN, WEAK, STRONG) < 0.3
    randoms = [apgr(RNG.random(len(WEAK)), WEAK, STRONG) for _ in range(20)]
    assert abs(float(np.mean(randoms)) - 0.5) < 0.02


def test_eleven_thresholds_at_the_deciles_the_top_one_strict() -> None:
    scores = np.arange(10.0)
    share, quality = decile_curve(scores, np.zeros(10), np.ones(10))
    assert len(share) == 11 and share[0] == 0.0 and share[-1] == 1.0  # score > max sends nothing to strong
    assert np.allclose(quality, share)


def test_a_hand_computed_apgr() -> None:
    # 4 prompts, only the top-scored one gains; deciles of [0, 1, 2, 3]
    scores, weak, strong = np.array([0.0, 1, 2, 3]), np.zeros(4), np.array([0.0, 0, 0, 1])
    share, quality = decile_curve(scores, weak, strong)
    # share steps: 1 (>=0), .75, .75, .75 (>=0.9..1.2 -> scores 1,2,3 ... ), ..., 0.25, 0
    expected = float(np.sum(np.diff(share) * (quality[1:] + quality[:-1]) / 2)) / 0.25
    assert apgr(scores, weak, strong) == pytest.approx(expected)
    assert 0.85 < apgr(scores, weak, strong) <= 1.0


def test_ties_go_together() -> None:
    share, _ = decile_curve(np.zeros(50), WEAK[:50], STRONG[:50])
    assert set(share) == {0.0, 1.0}
    assert apgr(np.zeros(50), WEAK[:50], STRONG[:50]) == pytest.approx(0.5)


def test_cpt_and_share_for_quality() -> None:
    assert cpt(GAIN, WEAK, STRONG, 0.5) <= 0.2 < cpt(RNG.random(len(WEAK)), WEAK, STRONG, 0.5)
    assert cpt(GAIN, WEAK, STRONG, 0.5) < cpt(GAIN, WEAK, STRONG, 0.8)
    assert share_for_quality(GAIN, WEAK, STRONG, 0.95) < 0.5
    assert share_for_quality(GAIN, STRONG, STRONG, 0.95) == 0.0  # weak already has the quality


def test_no_gap_is_nan_not_a_number_that_looks_measured() -> None:
    assert np.isnan(apgr(GAIN, STRONG, WEAK))


def test_bootstrap_intervals_are_paired_and_cover_the_value() -> None:
    idx = bootstrap_indices(len(WEAK), 100)
    noisy = GAIN + RNG.normal(0, 1.0, len(WEAK))
    s = summarize(noisy, WEAK, STRONG, idx)
    assert s["apgr"].low <= s["apgr"].value <= s["apgr"].high
    diff = paired_difference(GAIN, noisy, WEAK, STRONG, idx)
    assert diff.low > 0  # the oracle beats a noisy copy of itself on every resample
    r = random_summary(WEAK, STRONG, idx)
    assert r["apgr"].low < 0.5 < r["apgr"].high
