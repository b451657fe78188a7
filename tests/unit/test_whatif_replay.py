"""The replay pieces of `gateway whatif` (issue 40): a log line read back, one request decided again (bands,
sessions, max_tokens, limits and budgets on the log's clock, the cache, prices), the fleet's physics and timing,
and the calibration's errors."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from gateway.config import GatewayConfig
from gateway.emulator.profiles import PROFILES
from gateway.testing import TEST_API_KEY, gateway_config, tier
from gateway.whatif.calibrate import errors
from gateway.whatif.decide import Decider
from gateway.whatif.fleet import Arrival, Fleet
from gateway.whatif.physics import Fitted, Samples, fit
from gateway.whatif.records import Logged

KEY = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
BANDS = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}
TIERS = [tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=1.0, output_per_mtok=2.0),
         tier("large", ["http://127.0.0.1:10/v1", "http://127.0.0.1:11/v1"], input_per_mtok=10.0,
              output_per_mtok=20.0)]


def config(**tenant: Any) -> GatewayConfig:
    return gateway_config(TIERS, policy={"routing": BANDS, "tenants": [{"name": "t", "api_key_sha256": KEY,
                                                                         **tenant}]})


def line(n: int = 0, **over: Any) -> Logged:
    obj: dict[str, Any] = {
        "event": "request", "ts": "2026-11-21T10:00:00.000+00:00", "arrival_s": 1_795_000_000.0 + n,
        "path": "/v1/chat/completions", "tenant": "t", "model_requested": "auto", "difficulty": 0.2,
        "tier": "small", "status": 200, "outcome": "ok", "stream": True, "prompt_tokens": 100,
        "completion_tokens": 50, "cached_tokens": 0, "max_tokens": 64, "cache": "miss", "ttft_ms": 20.0,
        "tpot_ms": 7.0, "e2e_ms": 400.0, "cost_usd": 0.0002, "priced_from": "backend_usage", "replay": 1,
        "conversation": f"c{n}", "sticky": {"conversation": n, "user": None},
        "reading": {"input_tokens": 100, "input_chars": 400, "outputs": 1, "generated": 1,
                    "cacheable": "deterministic", "digest": f"{n:016x}"},
    }
    obj.update(over)
    return Logged(orjson.loads(orjson.dumps(obj)))


def test_a_line_reads_back_and_an_old_one_is_price_only() -> None:
    rec = line(3)
    assert (rec.tier, rec.prompt, rec.completion, rec.input_tokens, rec.digest, rec.replayable) == (
        "small", 100, 50, 100, f"{3:016x}", True)
    old = line(reading=None, replay=None, tier="large")
    assert not old.replayable
    decision = Decider(config()).decide(old)
    assert decision.tier == "large" and decision.cost == pytest.approx(100 * 10e-6 + 50 * 20e-6)


def test_bands_decide_the_tier_and_the_candidate_prices_it() -> None:
    decider = Decider(config())
    easy, hard = decider.decide(line(0)), decider.decide(line(1, difficulty=0.9))
    assert (easy.tier, hard.tier) == ("small", "large")
    assert easy.cost == pytest.approx(100e-6 + 100e-6) and hard.cost == pytest.approx(1000e-6 + 1000e-6)


def test_a_session_only_moves_up() -> None:
    decider = Decider(config(sessions={"ttl_s": 60}))
    first = decider.decide(line(0, difficulty=0.9, conversation="same"))
    second = decider.decide(line(1, difficulty=0.1, conversation="same"))
    assert (first.tier, second.tier, second.session_route) == ("large", "large", "held")
    later = decider.decide(line(100, difficulty=0.1, conversation="same"))  # the TTL ran out
    assert (later.tier, later.session_route) == ("small", "new")


def test_max_tokens_cuts_the_output_and_reject_refuses() -> None:
    clamped = Decider(config(max_tokens={"default": 16, "maximum": 20})).decide(line(0))
    assert clamped.completion == 20
    refused = Decider(config(max_tokens={"default": 16, "maximum": 20, "on_exceed": "reject"})).decide(line(0))
    assert refused.refused == "max_tokens_exceeded" and refused.cost == 0


def test_rate_limit_on_the_log_clock_refuses_then_the_window_turns() -> None:
    decider = Decider(config(rate_limit={"requests_per_min": 2}))
    refused = [decider.decide(line(n)).refused for n in range(4)]
    assert refused == [None, None, "rate_limit_requests", "rate_limit_requests"]
    assert decider.decide(line(200)).refused is None  # minutes later


def test_a_budget_runs_out_after_the_answers_are_booked() -> None:
    decider = Decider(config(daily_budget_usd=0.0003))
    outcomes = [decider.decide(line(n)).refused for n in range(4)]  # 0.0002 each, booked 0.4 s after arrival
    assert outcomes == [None, None, "budget_exhausted", "budget_exhausted"]
    assert [tenant for tenant, _ in decider.limits.exhausted] == ["t"]


def test_the_cache_hits_what_was_answered_before_on_the_new_tier() -> None:
    decider = Decider(config())
    one = decider.decide(line(0, difficulty=0.9, tier="small"))
    again = decider.decide(line(5, difficulty=0.9, tier="small", reading={
        "input_tokens": 100, "input_chars": 400, "outputs": 1, "generated": 1, "cacheable": "deterministic",
        "digest": f"{0:016x}"}))
    assert (one.cache, again.cache, again.cost) == ("miss", "hit", 0.0)
    off = Decider(config(cache={"enabled": False})).decide(line(0, difficulty=0.9, tier="small"))
    assert off.cache == "bypass"


def test_fit_takes_the_least_loaded_measurements() -> None:
    samples = Samples()
    for i in range(200):
        samples.add(100, 50.0 + i, 10.0 + i / 10)
    fitted = fit(TIERS[0], samples)
    assert fitted.profile.tpot_1_s == pytest.approx(0.011, rel=0.05)
    expected = 0.0599 - 100 / fitted.profile.prefill_tps - fitted.profile.tpot_1_s
    assert fitted.overhead_s == pytest.approx(expected, rel=0.05)


def test_the_fleet_queues_when_the_replica_is_busy_and_sheds_past_the_queue() -> None:
    profile = PROFILES["overload"]  # 8 running at most
    physics = {"small": Fitted(profile, 0.0, 0, "overload"), "large": Fitted(profile, 0.0, 0, "overload")}
    routes = gateway_config(TIERS, admission={"initial_limit": 2, "min_limit": 1, "max_queue": 1,
                                              "max_wait_ms": 10_000}).routes
    arrivals = [Arrival(0.0, "t", "small", 100, 20) for _ in range(4)]
    Fleet(routes, physics).run(arrivals)
    first, second, queued, shed = arrivals
    alone = (100 / profile.prefill_tps + profile.tpot_1_s) * 1000
    assert first.ttft_ms == pytest.approx(alone)  # prefill and one decode step
    assert first.ttft_ms is not None and second.ttft_ms is not None and first.ttft_ms < second.ttft_ms < 3 * alone  # the next step's batch
    assert queued.ttft_ms is not None and queued.ttft_ms > 19 * profile.tpot_1_s * 1000  # waited for a slot
    assert shed.shed == "queue_full" and shed.ttft_ms is None


def test_calibration_errors_are_relative_and_in_points() -> None:
    recorded = {"cost_usd": 1.0, "ttft_p50_ms": 100.0, "ttft_p99_ms": 200.0, "refused": {"x": 10},
                "tiers": {"a": {"share": 0.5, "requests": 5, "cost_usd": 0.5, "ttft_p50_ms": 100.0,
                                "ttft_p99_ms": 200.0}}}
    replayed = {"cost_usd": 1.02, "ttft_p50_ms": 90.0, "ttft_p99_ms": 260.0, "refused": {"x": 11},
                "tiers": {"a": {"share": 0.48, "requests": 5, "cost_usd": 0.5, "ttft_p50_ms": 90.0,
                                "ttft_p99_ms": 260.0}}}
    e = errors(recorded, replayed)
    assert (e["cost"], e["ttft_p50"], e["ttft_p99"]) == (pytest.approx(0.02), pytest.approx(-0.1), pytest.approx(0.3))
    assert e["tiers"]["a"]["share_points"] == pytest.approx(-2.0) and e["refused"]["x"]["error"] == pytest.approx(0.1)
