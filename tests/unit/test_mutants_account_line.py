"""The request's log line field by field, and the counts it is priced from (gateway/stages/account.py
`Accountant.settle`, `count_tokens`, `input_tokens`, `_qualities`, `_ms`), pinned for the account-stage target's
mutants (issue 42): every field copied from the context has a distinct value here, and the line must say it;
times on a stopped clock; the metrics fed (or not, for a line outside the request path)."""

from __future__ import annotations

import dataclasses
import time
from datetime import date
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.clock import iso_ms, utc_day
from gateway.context import RequestContext
from gateway.stages.account import NO_ARM, Accountant
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context
from gateway.upstream.resume import ResumePart

SMALL = tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=0.2, output_per_mtok=0.6)
BIG = tier("big", ["http://127.0.0.1:9/v1"], input_per_mtok=3.0, output_per_mtok=15.0)
CONFIG = gateway_config([SMALL, BIG])
BODY = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}


class Counter:
    def __init__(self) -> None:
        self.prompts: list[tuple[str, dict]] = []
        self.texts: list[str] = []

    def count(self, text: str) -> int:
        self.texts.append(text)
        return len(text)

    def count_prompt(self, endpoint: str, body: dict) -> int:
        self.prompts.append((endpoint, body))
        return 77


class Counters:
    def __init__(self) -> None:
        self.counter = Counter()
        self.specs: list[Any] = []

    def for_spec(self, spec: Any) -> Counter:
        self.specs.append(spec)
        return self.counter


class Metrics:
    def __init__(self) -> None:
        self.observed: list[tuple] = []
        self.live = SimpleNamespace(record=lambda *a: self.observed.append(("live", *a)))
        self.outcomes = SimpleNamespace(observe=lambda *a: self.observed.append(("outcomes", *a)))

    def observe(self, *args: Any) -> None:
        self.observed.append(("observe", *args))


def accountant() -> tuple[Accountant, Counters, Metrics]:
    counters, metrics = Counters(), Metrics()
    return Accountant(counters, metrics), counters, metrics  # type: ignore[arg-type]


def served(stream: bool = True) -> RequestContext:
    ctx = request_context(CONFIG, BODY, request_id="r-42")
    ctx.body = dict(BODY)
    ctx.stream = stream
    ctx.path = "/v1/chat/completions"
    ctx.model_requested = "small"
    ctx.tenant = next(iter(CONFIG.tenants_by_key_hash.values()))
    ctx.route.tier = CONFIG.tiers["small"]
    ctx.route.difficulty = 0.123456
    ctx.route.route_reason = "difficulty below 0.5"
    ctx.route.predicted_ttft_s = 0.5
    ctx.route.rerouted_from = "gone"
    ctx.route.prefix_blocks = 3
    ctx.route.session = "sess-1"
    ctx.route.session_route = "kept"
    ctx.upstream.replica = ctx.route.tier.replicas[0]
    ctx.upstream.upstream_started = True
    ctx.upstream.usage_source = "backend"
    ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.cached_tokens = 1000, 6, 100
    ctx.upstream.attempts = 2
    ctx.upstream.output_capped = True
    ctx.upstream.finish_reason = "length"
    ctx.upstream.first_token_at = ctx.started + 0.25
    ctx.result.status, ctx.result.outcome, ctx.result.error = 207, "some_outcome", "some_error"
    ctx.queue_ms = 12.34567
    ctx.max_tokens, ctx.max_tokens_asked = 6, 9000
    ctx.cache = "miss"
    return ctx


def settle(ctx: RequestContext, monkeypatch: pytest.MonkeyPatch, observe: bool = True,
           after_s: float = 1.25) -> tuple[dict[str, Any], Metrics, Counters]:
    acc, counters, metrics = accountant()
    monkeypatch.setattr(time, "perf_counter", lambda: ctx.started + after_s)
    with capture_logs() as logs:
        acc.settle(ctx, observe)
    monkeypatch.undo()
    (line,) = [e for e in logs if e["event"] == "request"]
    return line, metrics, counters


def test_every_field_of_the_line_from_the_context(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    line, _, _ = settle(ctx, monkeypatch)
    day = utc_day(ctx.ts)
    cost = SMALL.price_at(day).cost_usd(1000, 6, 100)
    baseline = BIG.price_at(day).cost_usd(1000, 6, 100)
    expected = {
        "request_id": "r-42", "ts": iso_ms(ctx.ts), "path": "/v1/chat/completions", "tenant": ctx.tenant.name,
        "model_requested": "small", "difficulty": 0.1235, "quality": None, "route_reason": "difficulty below 0.5",
        "tier": "small", "backend": SMALL.replicas[0].name, "status": 207, "outcome": "some_outcome",
        "error": "some_error", "stream": True, "prompt_tokens": 1000, "completion_tokens": 6, "cached_tokens": 100,
        "usage_source": "backend", "priced_from": "backend_usage", "ttft_ms": 250.0, "tpot_ms": 200.0,
        "e2e_ms": 1250.0, "queue_ms": 12.346, "predicted_ttft_ms": 500.0, "brownout_from": None,
        "rerouted_from": "gone", "spilled_from": None, "spill": None, "escalated_from": None, "escalation": None,
        "max_tokens": 6, "max_tokens_clamped_from": 9000, "attempts": 2, "prefix_blocks": 3, "output_capped": True,
        "finish_reason": "length", "cache": "miss", "cost_usd": cost, "avoided_cost_usd": 0.0,
        "baseline_cost_usd": baseline, "saved_usd": round(baseline - cost, 9), "ttft_slo_ms": ctx.tenant.ttft_slo_ms,
        "resumed": False, "parts": None, "session": "sess-1", "session_route": "kept", **NO_ARM,
    }
    assert {k: line[k] for k in expected} == expected
    assert ctx.result.cost_usd == cost and ctx.finished_at == ctx.started + 1.25


def test_the_serving_metrics_get_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    line, metrics, _ = settle(ctx, monkeypatch)
    (observe, live, outcomes) = metrics.observed
    assert observe == ("observe", "small", 207, pytest.approx(1.25), pytest.approx(0.25), pytest.approx(0.2),
                       line["cost_usd"])
    saved = line["baseline_cost_usd"] - line["cost_usd"]
    assert live[0] == "live" and live[1] is ctx and live[2:4] == (pytest.approx(0.25), pytest.approx(0.2))
    assert live[4] == pytest.approx(saved) and isinstance(live[5], bool)
    assert outcomes == ("outcomes", ctx, live[5], pytest.approx(saved))


def test_a_line_outside_the_request_path_feeds_no_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    _, metrics, _ = settle(served(), monkeypatch, observe=False)
    assert metrics.observed == []


def test_a_request_without_a_tier_is_observed_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.route.tier = None
    line, metrics, _ = settle(ctx, monkeypatch)
    assert line["tier"] is None and line["cost_usd"] == 0.0
    assert metrics.observed[0][1:3] == ("none", 207)


@pytest.mark.parametrize(("stream", "first", "completion", "ttft", "tpot"), [
    (True, 0.25, 6, 250.0, 200.0),
    (True, 0.25, 2, 250.0, 1000.0),
    (True, 0.25, 1, 250.0, None),  # one token: no time per output token
    (True, None, 6, None, None),
    (False, 0.25, 6, 250.0, None),  # a whole answer: no TPOT
])
def test_times_on_a_stopped_clock(monkeypatch: pytest.MonkeyPatch, stream: bool, first: float | None,
                                  completion: int, ttft: float | None, tpot: float | None) -> None:
    ctx = served(stream)
    ctx.upstream.first_token_at = None if first is None else ctx.started + first
    ctx.upstream.completion_tokens = completion
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["ttft_ms"], line["tpot_ms"], line["e2e_ms"]) == (ttft, tpot, 1250.0)


def test_missing_counts_are_zero_and_missing_times_none(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.upstream.prompt_tokens = ctx.upstream.completion_tokens = None
    ctx.route.difficulty = None
    ctx.route.predicted_ttft_s = None
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["prompt_tokens"], line["completion_tokens"], line["tpot_ms"]) == (0, 0, None)
    assert (line["difficulty"], line["predicted_ttft_ms"]) == (None, None)


def test_the_quality_each_tier_was_predicted(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.route.quality_choice = SimpleNamespace(options=[SimpleNamespace(tier="small", quality=0.812345),
                                                        SimpleNamespace(tier="big", quality=0.9)])
    line, _, _ = settle(ctx, monkeypatch)
    assert line["quality"] == {"small": 0.8123, "big": 0.9}


def test_a_spill_is_logged_with_its_report(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.route.spill = SimpleNamespace(spilled_from="big", target="small", report=lambda: {"why": "queue"})
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["spilled_from"], line["spill"]) == ("big", {"why": "queue"})
    ctx = served()
    ctx.route.spill = SimpleNamespace(spilled_from=None, target=None, report=lambda: {"why": "x"})
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["spilled_from"], line["spill"]) == (None, None)


def test_an_experiments_arm_is_on_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.assignment = SimpleNamespace(log_fields=lambda: {"experiment": "e1", "arm": "b", "arm_control": False})
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["experiment"], line["arm"], line["arm_control"]) == ("e1", "b", False)


def test_a_resumed_answer_says_so_with_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.upstream.resumed_parts = [ResumePart("a", SMALL, 0), ResumePart("b", BIG, 2)]
    ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.cached_tokens = 2 * 500 + 2, 6, 0
    line, _, _ = settle(ctx, monkeypatch)
    assert line["resumed"] is True
    assert [(p["replica"], p["tier"], p["prompt_tokens"], p["completion_tokens"]) for p in line["parts"]] == [
        ("a", "small", 500, 2), ("b", "big", 502, 4)]
    assert line["cost_usd"] == pytest.approx(sum(p["cost_usd"] for p in line["parts"]))


def test_an_anonymous_request_has_no_slo(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.tenant = None
    line, _, _ = settle(ctx, monkeypatch)
    assert (line["tenant"], line["ttft_slo_ms"]) == ("anonymous", None)


# -- count_tokens ------------------------------------------------------------------------------------------------------

def test_the_backends_usage_is_not_counted_again() -> None:
    acc, counters, _ = accountant()
    ctx = served()
    acc.count_tokens(ctx)
    assert ctx.result.priced_from == "backend_usage" and counters.specs == []
    assert (ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens) == (1000, 6)


@pytest.mark.parametrize("stream", [True, False])
def test_a_backend_without_usage_is_counted_once(stream: bool) -> None:
    acc, counters, _ = accountant()
    ctx = served(stream)
    ctx.upstream.usage_source = None
    ctx.upstream.prompt_tokens = ctx.upstream.completion_tokens = None
    ctx.upstream.output_chunks = 4
    ctx.upstream.response_text = "twelve chars"
    acc.count_tokens(ctx)
    assert ctx.result.priced_from == "counted"
    assert counters.specs == [SMALL.tokenizer]
    assert counters.counter.prompts == [("chat", ctx.body)]
    assert (ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens) == (77, 4 if stream else 12)
    assert counters.counter.texts == ([] if stream else ["twelve chars"])
    acc.count_tokens(ctx)  # once: the counts now have a source
    assert counters.counter.prompts == [("chat", ctx.body)]


def test_a_whole_answer_without_text_counts_as_empty() -> None:
    acc, counters, _ = accountant()
    ctx = served(False)
    ctx.upstream.usage_source = None
    ctx.upstream.response_text = None
    acc.count_tokens(ctx)
    assert counters.counter.texts == [""] and ctx.upstream.completion_tokens == 0


def test_an_estimate_for_a_client_gone_keeps_its_output() -> None:
    acc, counters, _ = accountant()
    ctx = served()
    ctx.upstream.usage_source = None
    ctx.upstream.upstream_started = False
    ctx.result.priced_from = "estimated_decode_rate"
    ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens = None, 9
    acc.count_tokens(ctx)
    assert ctx.result.priced_from == "estimated_decode_rate"
    assert (ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens) == (77, 9)


@pytest.mark.parametrize("case", ["no backend worked", "no tier"])
def test_nothing_is_counted_for_a_request_no_backend_worked_on(case: str) -> None:
    acc, counters, _ = accountant()
    ctx = served()
    ctx.upstream.usage_source = None
    ctx.upstream.prompt_tokens = None
    if case == "no tier":
        ctx.route.tier = None
    else:
        ctx.upstream.upstream_started = False
    acc.count_tokens(ctx)
    assert counters.specs == [] and ctx.upstream.prompt_tokens is None and ctx.result.priced_from is None


def test_input_tokens_are_the_tiers_count_of_a_chat_body() -> None:
    acc, counters, _ = accountant()
    assert acc.input_tokens(BIG, BODY) == 77
    assert counters.specs == [BIG.tokenizer] and counters.counter.prompts == [("chat", BODY)]
    assert acc.counters is counters


# -- _prices: what test_mutants_account.py left ----------------------------------------------------------------------

def dated(t: Any, later: float) -> Any:
    from gateway.config.routes import Prices

    first = t.prices
    change = Prices(effective_from=date(2026, 6, 1), input_per_mtok=first.input_per_mtok * later,
                    output_per_mtok=first.output_per_mtok * later)
    return t.model_copy(update={"prices": (first, change)})


def test_an_escalated_answers_first_part_at_the_days_prices() -> None:
    from gateway.routing.escalate import Escalation
    from gateway.stages.account import _prices

    small, big = dated(SMALL, 2.0), dated(BIG, 10.0)
    c = request_context(gateway_config([small, big]), BODY)
    c.route.tier = c.config.tiers["big"]
    c.upstream.upstream_started = True
    c.upstream.prompt_tokens, c.upstream.completion_tokens = 1000, 500
    c.escalation = Escalation(rule=None, confidence=0.2, from_tier=small, from_replica="small-0",  # type: ignore[arg-type]
                              prompt_tokens=100, completion_tokens=50, cached_tokens=0, first_ms=10.0)
    served = (1000 * 30.0 + 500 * 150.0) / 1e6  # big on 2026-06-01: ten times
    first_small = (100 * 0.4 + 50 * 1.2) / 1e6  # the first part on small's prices of the day: twice
    first_big = (100 * 30.0 + 50 * 150.0) / 1e6
    assert _prices(c, date(2026, 6, 1)) == pytest.approx((served + first_small, 0.0, served + first_big))


def test_a_resumed_answer_served_on_the_baseline_tier_is_its_own_baseline() -> None:
    from gateway.stages.account import _prices

    c = request_context(CONFIG, BODY)
    c.route.tier = CONFIG.tiers["big"]  # the baseline
    c.upstream.upstream_started = True
    c.upstream.resumed_parts = [ResumePart("a", SMALL, 0), ResumePart("b", BIG, 2)]
    c.upstream.prompt_tokens, c.upstream.completion_tokens, c.upstream.cached_tokens = 2 * 500 + 2, 6, 0
    day = date(2026, 11, 25)
    parts = SMALL.price_at(day).cost_usd(500, 2, 0) + BIG.price_at(day).cost_usd(502, 4, 0)
    assert _prices(c, day) == pytest.approx((parts, 0.0, parts))


# -- the rest of settle's survivors ---------------------------------------------------------------------------------

def test_times_keep_three_decimals_of_a_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    ctx.upstream.first_token_at = ctx.started + 0.2501234
    line, _, _ = settle(ctx, monkeypatch, after_s=1.2505678)
    assert (line["ttft_ms"], line["e2e_ms"]) == (250.123, 1250.568)


def test_settle_feeds_the_metrics_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = served()
    acc, _, metrics = accountant()
    with capture_logs():
        acc.settle(ctx)
    assert [o[0] for o in metrics.observed] == ["observe", "live", "outcomes"]


@pytest.mark.parametrize(("slo_ms", "good"), [(300.0, True), (200.0, False), (None, True)])
def test_goodput_is_judged_on_the_first_tokens_time(monkeypatch: pytest.MonkeyPatch, slo_ms: float | None,
                                                    good: bool) -> None:
    ctx = served()
    ctx.result.status = 200
    ctx.tenant = dataclasses.replace(ctx.tenant, ttft_slo_ms=slo_ms)
    _, metrics, _ = settle(ctx, monkeypatch)
    (_, live, outcomes) = metrics.observed
    assert live[5] is good and outcomes[2] is good


def dated_config() -> Any:
    return gateway_config([dated(SMALL, 2.0), dated(BIG, 10.0)])


def test_a_resumed_answer_on_dated_prices_is_priced_at_the_days(monkeypatch: pytest.MonkeyPatch) -> None:
    config = dated_config()
    ctx = served()
    ctx.config = config
    small, big = config.tiers["small"], config.tiers["big"]
    ctx.route.tier = small
    ctx.upstream.resumed_parts = [ResumePart("a", small, 0), ResumePart("b", big, 2)]
    ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.cached_tokens = 2 * 500 + 2, 6, 0
    line, _, _ = settle(ctx, monkeypatch)
    day = utc_day(ctx.ts)
    assert day >= date(2026, 6, 1)  # the later prices
    assert [p["cost_usd"] for p in line["parts"]] == [small.price_at(day).cost_usd(500, 2, 0),
                                                      big.price_at(day).cost_usd(502, 4, 0)]
    assert line["cost_usd"] == pytest.approx(sum(p["cost_usd"] for p in line["parts"]))


def test_an_escalated_answers_parts_on_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.routing.escalate import Escalation

    config = dated_config()
    ctx = served()
    ctx.config = config
    ctx.route.tier = config.tiers["big"]
    ctx.upstream.cached_tokens = 0
    ctx.escalation = Escalation(rule=SimpleNamespace(min_confidence=0.5, hold_tokens=8),  # type: ignore[arg-type]
                                confidence=0.2, from_tier=config.tiers["small"], from_replica="small-0",
                                prompt_tokens=100, completion_tokens=50, cached_tokens=0, first_ms=10.0)
    line, _, _ = settle(ctx, monkeypatch)
    day = utc_day(ctx.ts)
    served_cost = config.tiers["big"].price_at(day).cost_usd(1000, 6, 0)
    first = config.tiers["small"].price_at(day).cost_usd(100, 50, 0)
    assert line["escalated_from"] == "small"
    first_part, second_part = line["escalation"]["parts"]
    assert first_part["cost_usd"] == first
    assert second_part["cost_usd"] == pytest.approx(served_cost, abs=1e-12)
    assert line["cost_usd"] == pytest.approx(served_cost + first, abs=1e-12)



def test_the_counter_is_the_served_tiers() -> None:
    acc, counters, _ = accountant()
    t = tier("counted", ["http://127.0.0.1:9/v1"], tokenizer="emulator")
    ctx = served(False)
    ctx.route.tier = t
    ctx.upstream.usage_source = None
    acc.count_tokens(ctx)
    assert counters.specs == ["emulator"]
    assert acc.input_tokens(t, BODY) == 77 and counters.specs == ["emulator", "emulator"]


def test_prepare_builds_the_counters_of_the_configs_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.stages.account as account

    built: list[tuple[Any, Any]] = []
    monkeypatch.setattr(account, "build_counters", lambda routes, counters: built.append((routes, counters)))
    acc, counters, _ = accountant()
    acc.prepare(CONFIG)
    assert built == [(CONFIG.routes, counters)]
