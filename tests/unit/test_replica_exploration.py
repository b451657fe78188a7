"""What teaches a replica's TTFT model, and exploration: one bad sample cannot keep a replica idle (issue 30)."""

import math

import pytest

from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.stats import ReplicaStats, sample_weight, server_decode_s
from gateway.config import Replica
from gateway.config.routes import Balancing
from gateway.testing import gateway_config, tier

EXPLORING = Balancing(near_tie=0.0, explore_after_s=5.0)
CONFIG = gateway_config([tier("t", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"])], balancing={
    "explore_after_s": 5.0})
TIER = CONFIG.tiers["t"]
A, B = TIER.replicas


def take(pool: ReplicaPool, replica: Replica, tokens: int = 20) -> Lease:
    return Lease(pool, replica, TIER, tokens, 0, CONFIG.routes.balancing)


def streamed(pool: ReplicaPool, replica: Replica, ttft_s: float) -> None:
    lease = take(pool, replica)
    lease.first_byte(lease._sent_at + ttft_s)
    lease.release(completion=8)


def non_streamed(pool: ReplicaPool, replica: Replica, e2e_s: float, completion: int,
                 decode_s: float | None = None) -> Lease:
    lease = take(pool, replica)
    lease._sent_at -= e2e_s  # sent e2e_s ago: the whole answer arrives now
    lease.release(completion=completion, decode_s=decode_s)
    return lease


def test_a_non_streamed_answer_without_server_timings_is_not_a_ttft_sample() -> None:
    """The issue's trace: b's one non-streamed answer (3.9 s end to end) was taken for its TTFT, so b looked
    slow and was never picked again."""
    pool = ReplicaPool()
    for _ in range(3):
        streamed(pool, A, 0.2)
    lease = non_streamed(pool, B, 3.9, completion=200)
    b = pool.state(B)
    assert not b.tried and b.ttft_s is None and b.tpot_s is None
    assert b.e2e_s == pytest.approx(3.9, rel=0.01) and b.in_flight == 0 and b.pending_tokens == 0
    assert lease.first_at is not None  # still estimated, for the stages waiting for a first byte
    assert pool.predict(TIER, B, 20) == pytest.approx(pool.predict(TIER, A, 20))  # a's overhead, borrowed


def test_the_servers_own_decode_time_gives_a_non_streamed_answer_its_ttft() -> None:
    pool = ReplicaPool()
    non_streamed(pool, B, 3.9, completion=201, decode_s=3.7)
    b = pool.state(B)
    assert b.ttft_s == pytest.approx(0.2, abs=0.01)
    assert b.tpot_s == pytest.approx(3.7 / 200, rel=0.01)


def test_an_embedding_answer_is_all_first_token() -> None:
    pool = ReplicaPool()
    non_streamed(pool, B, 0.05, completion=0, decode_s=0.0)
    assert pool.state(B).ttft_s == pytest.approx(0.05, abs=0.005)


@pytest.mark.parametrize(("answer", "seconds"), [
    ({"timings": {"prompt_n": 12, "prompt_ms": 80.5, "predicted_n": 8, "predicted_ms": 250.0}}, 0.25),
    ({"timings": {"predicted_ms": 0}}, 0.0),
    ({}, None), ({"timings": None}, None), ({"timings": {"predicted_ms": "250"}}, None),
    ({"timings": {"predicted_ms": True}}, None), ({"timings": {"predicted_ms": -1.0}}, None),
    ({"timings": {"predicted_ms": math.nan}}, None), ({"timings": [250.0]}, None),
])
def test_server_decode_time_is_read_from_llama_cpps_timings(answer: dict, seconds: float | None) -> None:
    assert server_decode_s(answer) == seconds


def test_a_replica_passed_over_is_tried_again_once_per_interval() -> None:
    pool = ReplicaPool()
    streamed(pool, A, 0.2)
    state_a, state_b = pool.state(A), pool.state(B)
    state_b.observe_ttft(4.0, work=20, queue_s=0.0, alpha=0.2)  # one bad sample
    picked_b = state_b.picked_at = state_a.picked_at - 1.0
    assert pool.rank(TIER, 20, EXPLORING, now=picked_b + 1.1)[0] == A
    state_a.picked_at = picked_b + 6.0
    now = picked_b + 6.1  # b passed over for 6.1 s while a was picked 0.1 s ago
    assert pool.rank(TIER, 20, EXPLORING, now=now) == (B, A)
    assert pool.rank(TIER, 20, EXPLORING, now=now + 1.0)[0] == A  # probed once, not every request
    state_a.picked_at = now + 4.9  # a keeps being picked
    assert pool.rank(TIER, 20, EXPLORING, now=now + 5.0)[0] == B  # another interval passed over
    assert pool.rank(TIER, 20, Balancing(near_tie=0.0, explore_after_s=0.0), now=now + 20.0)[0] == A  # off


def test_an_idle_tier_passes_nobody_over() -> None:
    pool = ReplicaPool()
    streamed(pool, A, 0.2)
    pool.state(B).observe_ttft(4.0, work=20, queue_s=0.0, alpha=0.2)
    pool.state(B).picked_at = pool.state(A).picked_at - 60.0
    assert pool.rank(TIER, 20, EXPLORING, now=pool.state(A).picked_at + 30.0)[0] == A


def test_a_sample_after_a_long_gap_outweighs_the_old_ones() -> None:
    state = ReplicaStats()
    state.observe_ttft(4.0, work=0, queue_s=0.0, alpha=0.2, stale_s=5.0, now=100.0)
    state.observe_ttft(0.1, work=0, queue_s=0.0, alpha=0.2, stale_s=5.0, now=100.5)  # soon after: alpha
    assert state.ttft_s == pytest.approx(4.0 + 0.2 * (0.1 - 4.0))
    state.observe_ttft(0.1, work=0, queue_s=0.0, alpha=0.2, stale_s=5.0, now=130.5)  # 30 s later
    assert state.ttft_s == pytest.approx(0.1, abs=0.02) and state.overhead_s == pytest.approx(0.1, abs=0.02)
    assert sample_weight(0.2, 1.0, 0.0) == 0.2 and sample_weight(0.2, None, 5.0) == 0.2
    assert sample_weight(0.2, 5.0, 5.0) == pytest.approx(1 - math.exp(-1))


def test_predictions_closer_than_the_ttft_noise_are_near_ties() -> None:
    """Two identical llama.cpp servers measured 80 +- 60 ms and 150 +- 60 ms: the first was picked every time
    its slots allowed (71 % of a mixed load); within the noise, the less loaded of the two is picked."""
    pool = ReplicaPool(seed=3)
    state_a, state_b = pool.state(A, TIER), pool.state(B, TIER)
    for ttft in (0.02, 0.14) * 4:
        state_a.observe_ttft(ttft, work=0, queue_s=0.0, alpha=0.2)
        state_b.observe_ttft(ttft + 0.05, work=0, queue_s=0.0, alpha=0.2)
    assert state_a.ttft_dev_s is not None and state_a.ttft_dev_s > 0.05
    assert pool.predict(TIER, A, 0) < pool.predict(TIER, B, 0) < pool.predict(TIER, A, 0) * 1.1 + state_a.ttft_dev_s
    take(pool, A)  # a busier
    assert {pool.rank(TIER, 0, Balancing(near_tie=0.1, explore_after_s=0.0))[0] for _ in range(10)} == {B}
    state_a.ttft_dev_s = 0.0  # no noise: a is simply faster
    assert pool.rank(TIER, 0, Balancing(near_tie=0.1, explore_after_s=0.0))[0] == A
