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
from gateway.whatif.summary import Tally

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
        "sticky": {"conversation": n, "user": None},
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


def turn(n: int, parent: str | None, current: str, **over: Any) -> Logged:
    return line(n, turn_keys={"parent": parent, "current": current}, replay=2, **over)


def test_a_session_follows_the_conversation_and_only_moves_up() -> None:
    decider = Decider(config(sessions={"ttl_s": 60}))
    first = decider.decide(turn(0, None, "t1", difficulty=0.9))
    second = decider.decide(turn(1, "t1", "t2", difficulty=0.1))  # follows the reply to turn 1
    assert (first.tier, first.session_route, second.tier, second.session_route) == ("large", "new", "large", "held")
    alike = decider.decide(turn(2, None, "t1", difficulty=0.1))  # a new chat that opens alike inherits nothing
    assert (alike.tier, alike.session_route) == ("small", "new")
    later = decider.decide(turn(100, "t2", "t3", difficulty=0.1))  # the TTL ran out
    assert (later.tier, later.session_route) == ("small", "new")
    old = decider.decide(line(101, difficulty=0.1))  # a line without turn_keys holds no session
    assert (old.tier, old.session_route) == ("small", None)


async def test_the_log_s_turn_keys_link_the_turns_the_session_step_links() -> None:
    """Each turn's `parent` is the `current` of the turn its last reply answered, as the server's session step
    finds the turn before by its reply (`conversation_keys`): the same links, from the log alone. The sticky key
    by conversation is the same on every turn; tools are not the conversation; an x-session-id names both."""
    from gateway.routing.sessions import conversation_keys, header_key
    from gateway.testing.contexts import parsed_context
    from gateway.whatif.logline import replay_fields

    cfg = gateway_config([tier("small", ["http://127.0.0.1:9/v1"])])
    system, user = {"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    one = [system, user]
    two = [*one, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    three = [*two, {"role": "assistant", "content": "more"}, {"role": "user", "content": "ok"}]
    lines, server = [], []
    for messages in (one, two, three):
        ctx = await parsed_context(cfg, {"model": "small", "messages": messages, "tools": [{"type": "function"}]})
        assert ctx.reading is not None
        lines.append(replay_fields(ctx))
        server.append(conversation_keys(ctx.tenant_name, ctx.reading))
    keys = [line["turn_keys"] for line in lines]
    assert keys[0]["parent"] is None and keys[1]["parent"] == keys[0]["current"]
    assert keys[2]["parent"] == keys[1]["current"] and len({k["current"] for k in keys}) == 3
    assert server[1].lookup == server[0].answered("hello") and server[2].lookup == server[1].answered("more")
    assert len({line["sticky"]["conversation"] for line in lines}) == 1  # one conversation, one arm
    plain = await parsed_context(cfg, {"model": "small", "messages": [system, {"role": "user", "content": "hi"}]})
    assert replay_fields(plain)["turn_keys"]["current"] == keys[0]["current"]  # the same parts: no tools
    other = await parsed_context(cfg, {"model": "small", "messages": [{"role": "system", "content": "be long"},
                                                                      user]})
    assert replay_fields(other)["sticky"]["conversation"] != lines[0]["sticky"]["conversation"]
    held = await parsed_context(cfg, {"model": "small", "messages": two})
    held.session_header = "chat-7"
    assert replay_fields(held)["turn_keys"] == {"parent": header_key(held.tenant_name, "chat-7"),
                                                "current": header_key(held.tenant_name, "chat-7")}


def test_spill_moves_a_turn_off_a_tier_the_log_shows_loaded() -> None:
    decider = Decider(config(spill={"ttft_slo_ms": 500}))
    decider.decide(line(0, difficulty=0.9, tier="large", predicted_ttft_ms=900.0))  # large forecast over the SLO
    hard = decider.decide(line(1, difficulty=0.9))
    assert (hard.tier, hard.spilled_from) == ("small", "large")
    idle = decider.decide(line(10, difficulty=0.9))  # the forecast is stale: large is taken as idle
    assert (idle.tier, idle.spilled_from) == ("large", None)
    spilled = line(20, difficulty=0.9, tier="small", spilled_from="large",
                   spill={"from": {"tier": "large", "ttft_ms": 800.0}, "to": {"tier": "small", "ttft_ms": 30.0}})
    assert decider.decide(spilled).tier == "small"  # the logged spill's own forecasts


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


def test_a_whole_answer_is_timed_at_its_last_token() -> None:
    fleet = Fleet(config().routes, {"small": Fitted(PROFILES["int4"], 0.0, 0, "int4")})
    streamed, whole = Arrival(0.0, "t", "small", 100, 20), Arrival(0.0, "t", "small", 100, 20, stream=False)
    fleet.run([streamed, whole])
    assert streamed.ttft_ms is not None and whole.ttft_ms is not None
    assert whole.ttft_ms > streamed.ttft_ms + 15 * PROFILES["int4"].tpot_1_s * 1000  # 19 more decode steps


def test_the_prefill_speed_is_the_slope_of_ttft_in_the_prompt() -> None:
    samples = Samples()
    for n in range(60):
        prompt = 20 + 10 * n
        queued = 400.0 if n % 7 == 0 else 0.0  # a few waited: the median slope does not see them
        samples.add(prompt, 5 + prompt / 300 * 1000 + n % 4 * 3 + queued, 20.0)
    fitted = fit(tier("small", ["http://127.0.0.1:9/v1"], precision="int4"), samples)
    assert fitted.profile.prefill_tps == pytest.approx(300, rel=0.05)  # not the int4 profile's 9,000


def test_the_fleet_fit_takes_decode_speed_and_ttft_maps_from_the_log() -> None:
    from gateway.whatif.replay import Row, Window
    from gateway.whatif.simulate import POOLED, fit_fleet, fitted_physics, simulate_window
    from gateway.whatif.summary import Tally

    cfg = gateway_config([tier("small", ["http://127.0.0.1:9/v1"], precision="int4")],
                         policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    # one request a second (no batching): 20 % slower decode than the profile, 10-30 ms beyond the physics
    rows, samples = [], {"small": Samples()}
    for n in range(60):
        ttft = 100 / 9000 * 1000 + 6.5 + 10 + n % 3 * 10
        rec = line(n, ttft_ms=ttft, tpot_ms=7.8, completion_tokens=20)
        rows.append(Row(rec, {}))
        samples["small"].add(100, ttft, 7.8)
    window = Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)
    fit = fit_fleet(cfg, window, samples)
    assert fit.tpot_1["small"] == pytest.approx(0.0078, rel=0.05)
    stream = fit.maps[("small", "stream")]
    assert stream.samples == 60 and fit.maps[(POOLED, "stream")] == stream
    assert ("small", "whole") not in fit.maps  # no whole answer logged
    # every request alike to the simulation: one knot, the logged TTFTs' mean (their spread the map cannot place)
    assert len(stream.sim) == 1 and stream.logged[0] == pytest.approx((100 / 9000 * 1000 + 6.5 + 20) / 1000, rel=0.01)
    tally = Tally()
    rows = [Row(r.rec, {"baseline": Decider(cfg).decide(r.rec)}) for r in rows]
    simulate_window("baseline", cfg, Window(window.start, window.end, rows), fitted_physics(cfg, samples, fit), tally)
    p50 = tally.ttft["small"].quantile(0.5)
    assert p50 is not None and p50 == pytest.approx(100 / 9000 * 1000 + 6.5 + 20, rel=0.1)


def test_a_quantile_map_is_monotone_and_adds_its_end_difference_beyond_its_knots() -> None:
    from gateway.whatif.physics import QuantileMap

    m = QuantileMap.fit([0.1, 0.2, 0.2, 0.4, 0.8], [0.3, 0.1, 0.5, 0.9, 2.0])  # pairing ignored: ranks matter
    assert m is not None and m.sim == (0.1, 0.2, 0.4, 0.8)
    assert m(0.2) == pytest.approx((0.3 + 0.5) / 2)  # a simulated time two requests share: their mean
    assert m(0.6) == pytest.approx(0.9 + (2.0 - 0.9) / 2)  # linear between knots
    assert m(1.8) == pytest.approx(1.8 + 2.0 - 0.8) and m(0.0) == pytest.approx(0.0)  # beyond: the ends' shift
    values = [m(x / 100) for x in range(200)]
    assert values == sorted(values)
    assert QuantileMap.fit([0.1] * 4, [0.2] * 4) is None  # below MIN_SAMPLES


def test_a_slot_is_held_as_long_as_the_log_held_it() -> None:
    from gateway.whatif.physics import QuantileMap

    profile = PROFILES["int4"]
    routes = gateway_config(TIERS, admission={"initial_limit": 1, "min_limit": 1, "max_queue": 4,
                                              "max_wait_ms": 10_000}).routes
    busy = QuantileMap.fit([0.0, 1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0, 6.0])  # 2 s longer than the engine
    assert busy is not None
    for held, wait in ((None, 0.0), (busy, 2.0)):
        fleet = Fleet(routes, {"small": Fitted(profile, 0.0, 0, "int4", busy_map=held)})
        first, second = Arrival(0.0, "t", "small", 100, 5), Arrival(0.0, "t", "small", 100, 5)
        fleet.run([first, second])
        assert first.done_s is not None and second.waited_s == pytest.approx(first.done_s + wait)


def test_a_shed_request_in_the_window_is_counted_once() -> None:
    from gateway.whatif.replay import Row, Window
    from gateway.whatif.simulate import record_window
    from gateway.whatif.summary import Tally

    shed = line(0, status=503, error="queue_timeout", ttft_ms=None, cost_usd=0.0, priced_from=None)
    tally = Tally()
    tally.add("t", shed.tier, shed.refused, 0.0, 0, "2026-11-21", False)  # the decision pass's count
    record_window(Window(shed.arrival, shed.arrival, [Row(shed, {})]), tally)  # the window's count replaces it
    assert tally.figures()["refused"] == {"queue_timeout": 1}


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
    assert "ttft_p50_at" not in e  # no recorded TTFTs given: no ranks


def test_calibration_says_where_the_replayed_ttfts_fall_among_the_recorded_ones() -> None:
    """A recorded median in a gap: on tier a 40 streamed first tokens at 100-139 ms and 40 queued answers at
    400-439 ms, on tier b one at 50 and one at 600 ms; the overall p50 lies between (269.5 ms): a replayed 150 ms is
    44 % below it, yet at the recorded 49.4th percentile. On tier a alone, 100 ms is its least (0th)."""
    tally = Tally()
    for ms in [100.0 + i for i in range(40)] + [400.0 + i for i in range(40)]:
        tally.ttft["a"].add(ms)
        tally.overall_ttft.add(ms)
    for ms in (50.0, 600.0):  # another tier's: overall only
        tally.ttft["b"].add(ms)
        tally.overall_ttft.add(ms)
    recorded = tally.figures()
    replayed = {**recorded, "ttft_p50_ms": 150.0, "ttft_p99_ms": 600.0,
                "tiers": {"a": {**recorded["tiers"].get("a", {}), "ttft_p50_ms": 100.0, "ttft_p99_ms": None}}}
    e = errors(recorded, replayed, tally.ttft_rank)
    assert e["ttft_p50"] == pytest.approx(150 / 269.5 - 1, abs=1e-4)
    assert e["ttft_p50_at"] == pytest.approx((40 + 11 / 261) / 81, abs=1e-4)  # between the 41st and 42nd TTFT
    assert e["ttft_p99_at"] == 1.0
    assert e["tiers"]["a"]["ttft_p50_at"] == 0.0 and e["tiers"]["a"]["ttft_p99_at"] is None


def _wide_skewed_log() -> tuple[GatewayConfig, Any, dict[str, Samples]]:
    """One streamed request every 2 s (no queue, no batching) with prompts of 20 to ~5,000 tokens, whose logged TTFT
    grows with the prompt much faster than linearly (a loaded CPU: long prompts wait for the core): what the fitted
    physics leaves out is wide (seconds), skewed, and tied to each request's own simulated TTFT."""
    import random

    from gateway.whatif.replay import Row, Window

    cfg = gateway_config([tier("small", ["http://127.0.0.1:9/v1"], precision="int4")],
                         policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    rng = random.Random(7)
    rows, samples = [], {"small": Samples()}
    for n in range(150):
        prompt = int(20 + rng.lognormvariate(5.0, 1.2))
        ttft = 30 + 3 * prompt + prompt ** 2 / 400  # ms
        rec = line(2 * n, ttft_ms=ttft, tpot_ms=7.0, completion_tokens=20, prompt_tokens=prompt,
                   e2e_ms=ttft + 19 * 7.0,
                   reading={"input_tokens": prompt, "input_chars": 4 * prompt, "outputs": 1, "generated": 1,
                            "cacheable": "deterministic", "digest": f"{n:016x}"})
        rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
        samples["small"].add(prompt, ttft, 7.0)
    return cfg, Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows), samples


def test_a_wide_skewed_overhead_replayed_against_its_own_policy_keeps_the_logged_median_and_tail() -> None:
    from gateway.whatif.simulate import fit_fleet, fitted_physics, record_window, simulate_window
    from gateway.whatif.summary import Tally

    cfg, window, samples = _wide_skewed_log()
    recorded, replayed = Tally(), Tally()
    record_window(window, recorded)
    simulate_window("baseline", cfg, window, fitted_physics(cfg, samples, fit_fleet(cfg, window, samples)), replayed)
    for q, target in ((0.5, 0.10), (0.99, 0.20)):
        logged, simulated = recorded.overall_ttft.quantile(q), replayed.overall_ttft.quantile(q)
        assert logged is not None and simulated is not None
        assert simulated == pytest.approx(logged, rel=target), q  # an independent draw per request: p50 +25 %


def test_a_cpu_served_tier_holds_its_slots_as_long_as_the_log_held_them() -> None:
    """llama.cpp on CPU decodes a whole answer faster per token than the streamed TPOT says (no per-token streaming
    on the shared cores): the decode speed of a CPU-served tier is fitted on how long the log held its slots (e2e less
    the queue, every answer), not on the streamed TPOT, else the simulated slots stay busy past the logged ends and
    requests the log admitted at once queue."""
    from gateway.config import Tier
    from gateway.whatif.replay import Row, Window
    from gateway.whatif.simulate import fit_fleet, fitted_physics

    cpu = Tier.model_validate({
        "name": "small", "precision": "int4", "context_window": 2048, "slots_per_replica": 1,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": "small-a", "url": "http://127.0.0.1:9/v1", "model": "m",
                      "launch": {"kind": "llama_cpp", "model": "gemma3-270m-q4_k_m", "parallel": 1}}]})
    cfg = gateway_config([cpu], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]},
                         admission={"initial_limit": 1, "min_limit": 1, "max_wait_ms": 10_000})
    rows, samples, at = [], {"small": Samples()}, 0.0
    for n in range(60):
        stream = n % 3 == 0  # a streamed answer (45 ms a token) takes 955 ms, a whole one 500 ms (the next: 0.7 s)
        e2e = 100 + 19 * 45.0 if stream else 500.0
        rec = line(n, arrival_s=1_795_000_000.0 + at, stream=stream, ttft_ms=100.0 if stream else e2e,
                   tpot_ms=45.0 if stream else None, e2e_ms=e2e, completion_tokens=20)
        rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
        if stream:
            samples["small"].add(100, 100.0, 45.0)
        at += 1.2 if stream else 0.7
    window = Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)
    physics = fitted_physics(cfg, samples, fit_fleet(cfg, window, samples))
    arrivals = [Arrival(r.rec.arrival, "t", "small", 100, 20, r.rec.stream) for r in rows]
    Fleet(cfg.routes, physics).run(arrivals)
    done = sorted(a.done_s for a in arrivals if a.done_s is not None)
    assert len(done) == 60 and done[30] == pytest.approx(0.5, rel=0.05)  # the logged median hold
    assert max(a.waited_s for a in arrivals) == 0.0  # as logged (streamed TPOT: ~0.2 s after each whole answer)


def test_a_host_speed_is_the_geometric_mean_of_the_answers_in_flight() -> None:
    from gateway.whatif.physics import HostSpeed

    speed = HostSpeed.fit([(0.0, 2.0, 2.0), (1.0, 3.0, 0.5), (5.0, 6.0, 4.0), (7.0, 8.0, 1.0), (7.0, 8.0, 1.0)])
    assert speed is not None and speed.samples == 5
    assert speed(0.5) == pytest.approx(2.0) and speed(1.5) == pytest.approx(1.0)  # sqrt(2 x 0.5)
    assert speed(2.5) == pytest.approx(0.5) and speed(5.5) == pytest.approx(4.0)
    assert speed(-1.0) == speed(4.0) == speed(7.5) == speed(9.0) == 1.0  # before, between and after: none in flight
    assert HostSpeed.fit([(0.0, 1.0, 2.0)] * 4) is None  # below MIN_SAMPLES


def _cpu_tier(parallel: int = 1) -> Any:
    from gateway.config import Tier

    return Tier.model_validate({
        "name": "small", "precision": "int4", "context_window": 2048, "slots_per_replica": parallel,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": "small-a", "url": "http://127.0.0.1:9/v1", "model": "m",
                      "launch": {"kind": "llama_cpp", "model": "gemma3-270m-q4_k_m", "parallel": parallel}}]})


def test_a_cpu_served_tier_runs_at_the_speed_the_log_measured_at_the_time() -> None:
    """The same load (one answer of the same size a second, one slot) on a machine that ran it in 0.5 s for half a
    minute, then in 1.5 s (other work on the cores): the log has no queue, then one that grows 0.5 s a request. The
    replay queues where and as much as the log did: each llama.cpp step at the machine's speed of its time, the slot
    held to the engine's last token. (A rank map of the holds gives every request, alike to the engine, the logged
    mean, 1 s: no queue at all.)"""
    from gateway.whatif.replay import Row, Window
    from gateway.whatif.simulate import fit_fleet, fitted_physics

    cfg = gateway_config([_cpu_tier()], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]},
                         admission={"initial_limit": 1, "min_limit": 1, "max_queue": 100, "max_wait_ms": 60_000})
    rows, free, queued = [], 0.0, []
    for n in range(60):
        hold = 0.5 if n < 30 else 1.5
        start = max(float(n), free)
        free = start + hold
        queued.append(start - n)
        e2e = (free - n) * 1000
        rec = line(n, stream=False, ttft_ms=e2e, tpot_ms=None, e2e_ms=e2e, queue_ms=(start - n) * 1000,
                   completion_tokens=20, backend="small-a")
        rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    window = Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)
    fleet = fit_fleet(cfg, window, {})
    assert fleet.hosts["127.0.0.1"](rows[10].rec.arrival + 0.1) == pytest.approx(0.5, rel=0.01)
    assert fleet.hosts["127.0.0.1"](rows[50].rec.arrival + 0.1) == pytest.approx(1.5, rel=0.01)
    physics = fitted_physics(cfg, {}, fleet)
    assert physics["small"].busy_map is None and physics["small"].host is not None
    arrivals = [Arrival(r.rec.arrival, "t", "small", 100, 20, False) for r in rows]
    Fleet(cfg.routes, physics).run(arrivals)
    assert max(a.waited_s for a in arrivals[:30]) < 0.01
    assert queued[-1] == pytest.approx(14.5)
    for arrival, logged in zip(arrivals[30:], queued[30:], strict=True):
        assert arrival.waited_s == pytest.approx(logged, abs=0.25)


def _cpu_pair() -> Any:
    """A llama.cpp tier of two one-slot replicas on one machine (127.0.0.1): their steps share its cores."""
    from gateway.config import Tier

    return Tier.model_validate({
        "name": "small", "precision": "int4", "context_window": 2048, "slots_per_replica": 1,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": f"small-{x}", "url": f"http://127.0.0.1:{port}/v1", "model": "m",
                      "launch": {"kind": "llama_cpp", "model": "gemma3-270m-q4_k_m", "parallel": 1}}
                     for x, port in (("a", 9), ("b", 10))]})


def test_two_replicas_busy_at_once_on_one_machine_each_run_slower_by_the_contention() -> None:
    """Two answers at once, one on each of a machine's two llama.cpp replicas, each take 1 + h times as long as one
    alone (the machine's external speed flat): the candidate's own concurrency, not the log's, sets the slowdown."""
    import dataclasses

    from gateway.whatif.physics import HostSpeed, base_profile

    cfg = gateway_config([_cpu_pair()], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    tier = cfg.routes.tiers[0]
    flat = HostSpeed((0.0,), (1.0,), 10, contention=0.6)
    physics = {"small": Fitted(base_profile(tier), 0.0, 10, "int4", host=flat)}
    alone = [Arrival(100.0, "t", "small", 10, 40, False)]
    together = [Arrival(100.0, "t", "small", 10, 40, False), Arrival(100.0, "t", "small", 10, 40, False)]
    Fleet(cfg.routes, physics).run(alone)
    Fleet(cfg.routes, physics).run(together)
    assert alone[0].done_s is not None and alone[0].waited_s == 0.0
    for request in together:
        # (the first one's first step starts before the other's: alone)
        assert request.waited_s == 0.0 and request.done_s == pytest.approx(1.6 * alone[0].done_s, rel=0.02)
    apart = [Arrival(100.0, "t", "small", 10, 40, False), Arrival(200.0, "t", "small", 10, 40, False)]
    Fleet(cfg.routes, physics).run(apart)  # never busy at once: as fast as alone
    assert [r.done_s for r in apart] == [pytest.approx(alone[0].done_s)] * 2
    assert flat.step(5.0, 2) == pytest.approx(2.2) and dataclasses.replace(flat, contention=0.0).step(5.0, 2) == 1.0


def test_the_contention_is_fitted_within_stretches_of_one_external_speed_and_capped() -> None:
    """Answers slowed 1 + 0.4 x (the machine's other replicas busy), on a machine whose external speed moves
    between 30-second stretches (1x, 2.5x, 0.7x, 1x): the fit finds 0.4 (the stretches' own speed taken out), though
    the others were busy in the slow stretch only (a fit across stretches takes its slowness for contention). A
    slowdown steeper than two shared cores allow (3x with one other busy) is capped at CONTENTION_MAX."""
    from gateway.whatif.physics import CONTENTION_MAX, Answer, fit_sharing

    def answer(mid: float, others: float, slowdown: float) -> Answer:  # alone on its replica, 1 s of engine time
        return Answer("small", mid, others, 0.0, slowdown, 0.1, 0.9)

    answers = []
    for stretch, external in enumerate((1.0, 2.5, 0.7, 1.0)):
        for i in range(12):
            others = (i % 2) * 0.5 + (1.5 if external > 1 else 0.0)  # the others busy in the slow stretch
            answers.append(answer(stretch * 30 + 2 * i + 0.5, others, external * (1 + 0.4 * others)))
    h, slopes = fit_sharing(answers)
    assert h == pytest.approx(0.4, abs=0.011) and slopes == {}  # no answer shared its replica: no slope to fit
    steep = [answer(2.0 * i, float(i % 2), 1.0 + 2.0 * (i % 2)) for i in range(12)]
    assert fit_sharing(steep)[0] == CONTENTION_MAX
    assert fit_sharing([answer(0.0, 1.0, 2.0)] * 2) == (0.0, {})  # too few in a stretch to say


def _pair_log(cfg: GatewayConfig) -> Any:
    """Log A on the two-replica machine: a request every second, 40 output tokens each; every other second a
    second one at once (on the other replica). One alone took 0.5 s; two at once 0.8 s each (contention 0.6), the
    machine's external speed flat."""
    from gateway.whatif.replay import Row, Window

    rows = []
    for n in range(90):
        pair = n % 2 == 0
        for k, backend in enumerate(("small-a", "small-b") if pair else ("small-a",)):
            e2e = 800.0 if pair else 500.0
            rec = line(2 * n + k, arrival_s=1_795_000_000.0 + n, stream=False, ttft_ms=e2e, tpot_ms=None,
                       e2e_ms=e2e, completion_tokens=40, prompt_tokens=10, backend=backend)
            rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    return Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)


def test_the_log_s_own_contention_is_fitted_and_the_rest_is_the_external_speed() -> None:
    from gateway.whatif.simulate import fit_fleet

    cfg = gateway_config([_cpu_pair()], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    window = _pair_log(cfg)
    host = fit_fleet(cfg, window, {}).hosts["127.0.0.1"]
    assert host.contention == pytest.approx(0.6, abs=0.011)
    for n in (10, 11, 50, 51):  # paired and alone alike: the external speed flat, at the median
        assert host(window.rows[0].rec.arrival + n + 0.2) == pytest.approx(1.0, abs=0.02)


def _each_alone_takes_half_a_second(cfg: GatewayConfig, window: Any, physics: Any) -> None:
    """A candidate that refuses the second of each pair of `window`: its 90 answers each run alone, in 0.5 s."""
    seen: set[float] = set()
    candidate = []
    for row in window.rows:
        if row.rec.arrival not in seen:
            seen.add(row.rec.arrival)
            candidate.append(Arrival(row.rec.arrival, "t", "small", 10, 40, False))
    Fleet(cfg.routes, physics).run(candidate)
    assert len(candidate) == 90
    for arrival in candidate:
        assert arrival.done_s == pytest.approx(0.5, rel=0.05)


def test_a_candidate_that_refuses_half_the_traffic_is_predicted_faster_on_a_flat_external_speed() -> None:
    """Log A's paired requests ran 0.8 s, its lone ones 0.5 s (the gateway's own two answers at once on two shared
    cores). A candidate that refuses the second of each pair (half the load at those moments) runs every answer
    alone: 0.5 s, as the log's lone ones. (Replaying the log's speed at each moment, as measured, would keep the
    paired moments' 0.8 s: the machine taken for slow then, whatever the candidate's load.)"""
    from gateway.whatif.simulate import fit_fleet, fitted_physics

    cfg = gateway_config([_cpu_pair()], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    window = _pair_log(cfg)
    physics = fitted_physics(cfg, {}, fit_fleet(cfg, window, {}))
    replayed = [Arrival(r.rec.arrival, "t", "small", 10, 40, False) for r in window.rows]
    Fleet(cfg.routes, physics).run(replayed)
    paired = [a.done_s or 0.0 for a, r in zip(replayed, window.rows, strict=True) if r.rec.e2e_ms == 800.0]
    assert sorted(paired)[len(paired) // 2] == pytest.approx(0.8, rel=0.05)  # log A against its own policy
    _each_alone_takes_half_a_second(cfg, window, physics)


def _shared_replica_log(cfg: GatewayConfig) -> Any:
    """Log A on one llama.cpp replica of two slots: a request every 2 s, 40 output tokens each, every other time a
    second one at once on the same replica. One alone took 0.5 s, two at once 1.5 s each: a second sequence on the
    replica cost two more single steps (q4 on one shared thread: docs/BENCHMARKS.md), the external speed flat."""
    from gateway.whatif.replay import Row, Window

    rows = []
    for n in range(90):
        pair = n % 2 == 0
        for k in range(2 if pair else 1):
            e2e = 1500.0 if pair else 500.0
            rec = line(2 * n + k, arrival_s=1_795_000_000.0 + 2 * n, stream=False, ttft_ms=e2e, tpot_ms=None,
                       e2e_ms=e2e, completion_tokens=40, prompt_tokens=10, backend="small-a")
            rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    return Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)


def test_a_tier_s_own_batch_slope_is_fitted_and_a_candidate_that_shares_less_runs_faster() -> None:
    """Log A's lone answers took 0.5 s, its paired ones (two at once on one replica) 1.5 s each: the fitted batch
    slope is 2 (not llama.cpp's nominal 1), and a candidate that refuses the second of each pair runs every answer
    at 0.5 s. (With the slope fixed at 1, what a pair costs beyond twice a step, 1.5x, is taken for the machine's
    external speed at the paired moments, and the candidate's lone answers then take 0.75 s.)"""
    from gateway.whatif.simulate import fit_fleet, fitted_physics

    cfg = gateway_config([_cpu_tier(parallel=2)], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]},
                         admission={"initial_limit": 2, "min_limit": 2, "max_wait_ms": 10_000})
    window = _shared_replica_log(cfg)
    fleet = fit_fleet(cfg, window, {})
    physics = fitted_physics(cfg, {}, fleet)
    replayed = [Arrival(r.rec.arrival, "t", "small", 10, 40, False) for r in window.rows]
    Fleet(cfg.routes, physics).run(replayed)
    paired = sorted(a.done_s or 0.0 for a, r in zip(replayed, window.rows, strict=True) if r.rec.e2e_ms == 1500.0)
    assert paired[len(paired) // 2] == pytest.approx(1.5, rel=0.05)  # log A against its own policy
    _each_alone_takes_half_a_second(cfg, window, physics)
    assert fleet.batch_slope["small"] == pytest.approx(2.0, abs=0.06)
    assert physics["small"].profile.batch_slope == fleet.batch_slope["small"]


def test_each_tier_s_batch_slope_and_the_contention_are_fitted_together() -> None:
    """Two tiers on one machine, slowed 1 + 0.3 x (the machine's other replicas busy) and, sharing their replica,
    1 + s x (the others on it) on their decode (s 2 for the q4 tier, 0.7 for the f16 one), on an external speed that
    moves between stretches: the fit finds h 0.3 and each tier's slope; a tier with fewer than BATCH_MIN answers
    that shared their replica keeps llama.cpp's nominal 1 (no slope returned)."""
    from gateway.whatif.physics import BATCH_MIN, Answer, fit_sharing

    answers, rare = [], []
    for stretch, external in enumerate((1.0, 1.8, 0.8, 1.2)):
        for i in range(16):
            others, beside = (i % 3) * 0.5, ((i // 3) % 3) * 0.5
            for tier, slope in (("q4", 2.0), ("f16", 0.7)):
                prefill, decode = 0.1, 0.8
                hold = external * (1 + 0.3 * others) * (prefill + decode * (1 + slope * beside))
                answers.append(Answer(tier, stretch * 30 + 1.5 * i + 0.5, others, beside, hold, prefill, decode))
            if i < (BATCH_MIN - 1) // 4:  # a third tier that seldom shared its replica
                rare.append(Answer("rare", stretch * 30 + 1.5 * i + 0.5, others, 1.0, external * 2.5, 0.1, 0.8))
    h, slopes = fit_sharing(answers + rare)
    assert h == pytest.approx(0.3, abs=0.011)
    assert slopes["q4"] == pytest.approx(2.0, abs=0.051) and slopes["f16"] == pytest.approx(0.7, abs=0.051)
    assert "rare" not in slopes


def _two_tier_machine_log(cfg: GatewayConfig) -> Any:
    """Log A on one machine with two llama.cpp tiers (a replica each, one slot): a small answer at each second and a
    large one half a second later, 20 output tokens each. For its first 20 seconds the small tier's answers took
    0.9 s, twice their 0.45 s after (its replica slow then: a slowness the large tier's answers, 0.45 s throughout,
    did not share)."""
    from gateway.whatif.replay import Row, Window

    rows = []
    for n in range(60):
        for k, (name, at, e2e) in enumerate((("small", n, 900.0 if n < 20 else 450.0), ("large", n + 0.5, 450.0))):
            rec = line(2 * n + k, arrival_s=1_795_000_000.0 + at, tier=name, stream=False, ttft_ms=e2e,
                       tpot_ms=None, e2e_ms=e2e, completion_tokens=20, prompt_tokens=10, backend=f"{name}-a")
            rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    return Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)


def test_each_tier_runs_at_the_external_speed_its_own_answers_measured() -> None:
    """The small tier's replica ran slow for 20 seconds, the large tier's beside it did not: replayed against its own
    policy, each tier's answers take their own logged time (the small ones 0.9 s then, the large ones 0.45 s
    throughout). One speed for the machine (the geometric mean of all answers in flight) spreads the small replica's
    slowness over both: the large answers that ran beside the slow small ones take 0.64 s, the small ones 0.80 s."""
    from gateway.config import Tier
    from gateway.whatif.simulate import fit_fleet, fitted_physics

    tiers = [Tier.model_validate({
        "name": name, "precision": precision, "context_window": 2048, "slots_per_replica": 1,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": f"{name}-a", "url": f"http://127.0.0.1:{port}/v1", "model": "m",
                      "launch": {"kind": "llama_cpp", "model": model, "parallel": 1}}]})
        for name, precision, port, model in (("small", "int4", 9, "gemma3-270m-q4_k_m"),
                                             ("large", "fp16", 10, "gemma3-270m-f16"))]
    cfg = gateway_config(tiers, policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]},
                         admission={"initial_limit": 1, "min_limit": 1, "max_wait_ms": 10_000})
    window = _two_tier_machine_log(cfg)
    physics = fitted_physics(cfg, {}, fit_fleet(cfg, window, {}))
    replayed = [Arrival(r.rec.arrival, "t", r.rec.tier or "", 10, 20, False) for r in window.rows]
    Fleet(cfg.routes, physics).run(replayed)
    for arrival, row in zip(replayed, window.rows, strict=True):
        assert arrival.waited_s == 0.0
        assert arrival.done_s == pytest.approx(row.rec.e2e_ms / 1000, rel=0.05), (row.rec.tier, row.rec.arrival)


def _one_a_second_log(cfg: GatewayConfig) -> Any:
    """40 streamed requests, one a second, 20 output tokens each, each decided under `cfg` as the baseline."""
    from gateway.whatif.replay import Row, Window

    rows = []
    for n in range(40):
        rec = line(n, completion_tokens=20, ttft_ms=30.0, e2e_ms=160.0)
        rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    return Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)


def test_an_ensemble_s_ttft_quantiles_are_the_median_replay_s_and_its_sheds_the_mean() -> None:
    """Three replays of one window, one fast, one a little slower, one so slow its queue fills: the figures' TTFT
    p50 and p99 are the middle replay's own (the median of each one's), not the pooled TTFTs' (whose p99 the slow
    replay's queue fills); a shed count is the mean over the replays, rounded; the sketches pool every TTFT."""
    import dataclasses

    from gateway.whatif.simulate import simulate_ensemble, simulate_window
    from gateway.whatif.summary import Tally

    cfg = gateway_config([tier("small", ["http://127.0.0.1:9/v1"], precision="int4")],
                         policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]},
                         admission={"initial_limit": 1, "min_limit": 1, "max_queue": 2, "max_wait_ms": 60_000})
    window = _one_a_second_log(cfg)
    members = [{"small": Fitted(dataclasses.replace(PROFILES["int4"], tpot_1_s=PROFILES["int4"].tpot_1_s * scale),
                                0.0, 0, "int4")} for scale in (1.0, 1.5, 40.0)]
    alone = []
    for physics in members:
        each = Tally()
        simulate_window("baseline", cfg, window, physics, each)
        alone.append(each)
    sheds = [sum(t.shed.values()) for t in alone]
    assert sheds[0] == sheds[1] == 0 and sheds[2] >= 2  # the slow replay's queue overflows
    tally = Tally()
    replays = simulate_ensemble("baseline", cfg, window, members, tally)
    assert len(replays) == 3 and len(tally.replays) == 3 and tally.window_requests == 40
    figures, middle = tally.figures(), alone[1].figures()
    assert (figures["ttft_p50_ms"], figures["ttft_p99_ms"]) == (middle["ttft_p50_ms"], middle["ttft_p99_ms"])
    for q in (0.5, 0.99):
        assert tally.ttft_quantile(q, tier="small") == alone[1].ttft_quantile(q, tier="small") is not None
        assert tally.ttft_quantile(q, tenant="t") == alone[1].ttft_quantile(q, tenant="t") is not None
    assert len(tally.overall_ttft) == sum(len(t.overall_ttft) for t in alone)
    pooled = tally.overall_ttft.quantile(0.99)
    assert pooled is not None and pooled > 2 * figures["ttft_p99_ms"]  # the slow replay's queue
    assert sum(tally.shed.values()) == round(sheds[2] / 3)


def test_the_fit_s_draws_are_seeded_bootstrap_refits_and_a_large_window_is_replayed_once() -> None:
    """The ensemble's draws (`fit_fleet`): the fit redone on bootstrap resamples of its samples (the machine's
    answers, the decode ratios), so the draws differ from one another around the point fit, which they leave as it
    is; seeded, so the same log gives the same draws. Their number: 16 for a small window, fewer as its replay's
    engine steps grow, one replay of the point fit from ENSEMBLE_STEPS on."""
    import random

    from gateway.whatif.replay import Row, Window
    from gateway.whatif.simulate import ENSEMBLE_STEPS, REPLAYS, ensemble, ensemble_size, fit_fleet

    cfg = gateway_config([_cpu_pair()], policy={"tenants": [{"name": "t", "api_key_sha256": KEY}]})
    rng = random.Random(3)
    rows = []
    for n in range(120):  # a request a second, every third one paired on the other replica; holds scattered
        for k, backend in enumerate(("small-a", "small-b") if n % 3 == 0 else ("small-a",)):
            e2e = (800.0 if n % 3 == 0 else 500.0) * rng.lognormvariate(0.0, 0.3)
            rec = line(2 * n + k, arrival_s=1_795_000_000.0 + n, stream=False, ttft_ms=e2e, tpot_ms=None,
                       e2e_ms=e2e, completion_tokens=40, prompt_tokens=10, backend=backend)
            rows.append(Row(rec, {"baseline": Decider(cfg).decide(rec)}))
    window = Window(rows[0].rec.arrival, rows[-1].rec.arrival, rows)
    point = fit_fleet(cfg, window, {}, replays=1)
    assert point.draws == () and point.members() == [point]
    fit = fit_fleet(cfg, window, {}, replays=6)
    assert fit.tpot_1 == point.tpot_1 and fit.hosts == point.hosts and fit.maps == point.maps
    assert len(fit.draws) == 6 and fit.members() == list(fit.draws) and all(d.draws == () for d in fit.draws)
    steps = [d.tpot_1["small"] for d in fit.draws]
    contentions = [d.hosts["127.0.0.1"].contention for d in fit.draws]
    assert len(set(steps)) > 1 and len(set(contentions)) > 1
    assert min(steps) < point.tpot_1["small"] * 1.2 and max(steps) > point.tpot_1["small"] / 1.2
    again = fit_fleet(cfg, window, {}, replays=6)
    assert [d.tpot_1 for d in again.draws] == [d.tpot_1 for d in fit.draws]
    assert [d.hosts for d in again.draws] == [d.hosts for d in fit.draws]
    assert len(ensemble(cfg, {}, fit)) == 6
    assert len(fit_fleet(cfg, window, {}).draws) == REPLAYS  # 160 answers of 40 tokens: a few thousand steps
    assert ensemble_size(24_000) == 16 and ensemble_size(100_000) == 4 and ensemble_size(ENSEMBLE_STEPS) == 1
    assert ensemble_size(ENSEMBLE_STEPS // 2) == 2 and ensemble_size(10 * ENSEMBLE_STEPS) == 1
