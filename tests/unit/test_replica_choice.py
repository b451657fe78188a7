"""Replica choice inside a tier: predicted TTFT, power of two choices, health, the lease's bookkeeping."""

import time

from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.stats import BackendLoad, TtftFit
from gateway.config import Replica, Tier
from gateway.config.routes import Balancing
from gateway.testing import gateway_config, tier

TIER = tier("t", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1", "http://127.0.0.1:11/v1"])
STRICT = Balancing(near_tie=0.0)
CONFIG = gateway_config([TIER])


def take(pool: ReplicaPool, replica: Replica, tokens: int = 100, of: Tier = CONFIG.tiers["t"]) -> Lease:
    """A lease as the proxy takes it, for a prompt of `tokens` with nothing warm."""
    return Lease(pool, replica, of, tokens, 0, CONFIG.routes.balancing)


def test_the_replica_with_less_prefill_queued_ahead_is_predicted_faster() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a, b, c = t.replicas
    leases = [take(pool, a, 4000), take(pool, b, 200)]
    assert pool.rank(t, 100, STRICT) == (c, b, a)
    leases[0].first_byte()  # a's long prompt is prefilled: only its decode remains
    assert pool.predict(t, a, 100) < pool.predict(t, b, 100)
    assert pool.state(a).pending_tokens == 0 and pool.state(b).pending_tokens == 200


def test_a_waiting_queue_inside_the_backend_raises_its_prediction() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a = t.replicas[0]
    idle = pool.predict(t, a, 100)
    for _ in range(2):  # a queue that lasts
        pool.state(a).observe_load(BackendLoad(running=4, waiting=8, at=time.monotonic()))
    assert pool.predict(t, a, 100) > idle + 1.0  # 8 waiting x ~1 s each / 4 running
    assert pool.rank(t, 100, STRICT)[-1] == a


def test_near_ties_go_to_the_less_loaded_of_two_drawn() -> None:
    pool = ReplicaPool(seed=1)
    t = CONFIG.tiers["t"]
    picks = []
    for _ in range(30):
        first = pool.rank(t, 100, Balancing(near_tie=0.1))[0]
        take(pool, first).release()
        picks.append(first.name)
    assert {picks.count(name) for name in set(picks)} <= set(range(7, 14))  # spread, none starved
    assert all(x != y for x, y in zip(picks, picks[1:]))  # never the one just picked


def test_open_circuits_and_failed_health_checks_leave_the_ranking() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a, b, c = t.replicas
    for _ in range(CONFIG.routes.balancing.breaker.failures):
        take(pool, a).release(failed=True)
    pool.state(b).healthy = False
    assert pool.rank(t, 100, STRICT) == (c,)
    assert pool.state(a).failures == 5 and pool.state(a).breaker.retry_in() > 4.0
    pool.state(c).healthy = False
    assert pool.rank(t, 100, STRICT) == () and pool.retry_in(t) == 0.0  # b and c wait for a health check


def test_ttft_is_fitted_as_overhead_plus_prefill_and_untried_replicas_borrow_the_overhead() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a, b, _ = t.replicas
    for tokens in (100, 1100, 300, 2100, 600) * 4:  # observed: 50 ms + 0.5 ms per token
        lease = take(pool, a, tokens)
        lease.first_byte(lease._sent_at + 0.05 + 0.0005 * tokens)
        lease.release()
    assert abs(pool.state(a).overhead_s - 0.05) < 1e-6  # type: ignore[operator]
    assert abs(pool.predict(t, a, 1000) - 0.55) < 1e-6
    assert abs(pool.predict(t, b, 0) - 0.05) < 1e-6  # b: the tier's overhead, the hint's slope


def test_round_robin_rotates_whatever_the_load() -> None:
    four = tier("r", [f"http://127.0.0.1:{port}/v1" for port in range(20, 24)])
    pool = ReplicaPool()
    take(pool, four.replicas[0], 8000, four)  # heavily loaded, and still taken in turn
    firsts = []
    for _ in range(8):
        first = pool.rank(four, 100, Balancing(strategy="round_robin"))[0]
        take(pool, first, of=four).release()  # a lease between picks must not skip a replica
        firsts.append(first.name)
    assert firsts == ["r-0", "r-1", "r-2", "r-3"] * 2


def test_requests_beyond_the_batch_slots_predict_a_queue() -> None:
    four_slots = CONFIG.tiers["t"].model_copy(update={"slots_per_replica": 4})
    pool = ReplicaPool()
    a = four_slots.replicas[0]
    state = pool.state(a, four_slots)
    state.e2e_s = 2.0
    leases = [take(pool, a, 10, four_slots) for _ in range(3)]
    for lease in leases:
        lease.first_byte()
    idle = pool.predict(four_slots, a, 10)
    take(pool, a, 10, four_slots).first_byte()  # the 4th fills the slots: a 5th would wait
    assert idle < 0.1 and pool.predict(four_slots, a, 10) >= 0.5  # one slot frees every 2 s / 4
    assert pool.rank(four_slots, 10, STRICT)[-1] == a
    assert pool.capacity(four_slots) == 12


def test_only_a_queue_seen_twice_in_a_row_on_metrics_counts() -> None:
    state = ReplicaPool().state(CONFIG.tiers["t"].replicas[0])
    state.e2e_s = 2.0
    state.observe_load(BackendLoad(running=3, waiting=1, at=time.monotonic()))
    assert state.queue_s() == 0.0  # one request waiting for the next step: not a queue
    state.observe_load(BackendLoad(running=3, waiting=2, at=time.monotonic()))
    assert abs(state.queue_s() - 2 * 2.0 / 3) < 1e-9
    state.observe_load(BackendLoad(running=3, waiting=0, at=time.monotonic()))
    assert state.queue_s() == 0.0


def test_a_ttft_seen_behind_a_queue_does_not_teach_the_overhead() -> None:
    state = ReplicaPool().state(CONFIG.tiers["t"].replicas[0])
    state.observe_ttft(0.05, work=100, queue_s=0.0, alpha=0.2)
    state.observe_ttft(3.0, work=100, queue_s=0.5, alpha=0.2)  # the queue's length was a guess
    assert state.overhead_s is not None and abs(state.overhead_s + 100 / 4000 - 0.05) < 1e-9


def test_the_tier_capacity_is_known_once_every_replica_has_slots() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    assert pool.capacity(t) is None
    assert pool.capacity(t.model_copy(update={"slots_per_replica": 8})) == 24


def test_a_reload_gives_known_replicas_the_new_tier_settings_and_keeps_what_they_learned() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a = t.replicas[0]
    pool.state(a, t).e2e_s = 2.0
    assert pool.state(a).slots is None
    reloaded = gateway_config([t.model_copy(update={"slots_per_replica": 4, "prefill_tokens_per_s": 1234.0})])
    pool.configure(reloaded.routes)
    assert (pool.state(a).slots, pool.state(a).prefill_tps, pool.state(a).e2e_s) == (4, 1234.0, 2.0)


def test_exact_ties_go_to_fewer_in_flight_then_the_least_recently_picked_then_the_tier_order() -> None:
    pool = ReplicaPool()
    t = CONFIG.tiers["t"]
    a, b, c = t.replicas
    assert pool.rank(t, 100, STRICT) == (a, b, c)  # nothing known: the same prediction for all
    pool.state(a).in_flight = 1  # no batch slots known: in flight changes no prediction, only the order
    assert pool.rank(t, 100, STRICT) == (b, c, a)
    pool.state(b).last_pick = 2
    assert pool.rank(t, 100, STRICT) == (c, b, a)
    pool.state(a).in_flight, pool.state(a).last_pick = 0, 1
    assert pool.rank(t, 100, STRICT) == (c, a, b)


def test_the_slope_is_refitted_at_each_sample_and_from_moments_given_whole() -> None:
    fit, hint = TtftFit(), 1 / 4000
    for work in (100, 2000, 600):  # observed: 50 ms + 0.5 ms per token
        assert fit.slope(hint) == hint  # under 3 samples: the tier's hint
        fit.add(work, 0.05 + 0.0005 * work, alpha=0.5)
    assert abs(fit.slope(hint) - 0.0005) < 1e-9
    overhead = fit.overhead(fit.slope(hint))
    assert overhead is not None and abs(overhead - 0.05) < 1e-9
    same = TtftFit(fit.samples, fit.mean_x, fit.mean_y, fit.mean_xx, fit.mean_xy)
    assert same.slope(hint) == fit.slope(hint) and same == fit
    flat = TtftFit(3, 500.0, 0.3, 500.0 ** 2 + 10.0, 150.0)  # work spread under MIN_WORK_SPREAD
    assert flat.slope(hint) == hint and TtftFit().overhead(hint) is None
