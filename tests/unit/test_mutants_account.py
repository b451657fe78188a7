"""What a request is priced at when it is settled (issue 42: mutants of `_prices` in gateway/stages/account.py
that the settle tests let survive): the served tier's price of its tokens as cost, or as avoided cost for a
cache hit; the baseline tier's price of the same tokens; nothing for a request no backend worked on."""

from __future__ import annotations

from datetime import date

import pytest

from gateway.context import RequestContext
from gateway.stages.account import _prices
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context

SMALL = tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=0.2, output_per_mtok=0.6)
BIG = tier("big", ["http://127.0.0.1:9/v1"], input_per_mtok=3.0, output_per_mtok=15.0)
CONFIG = gateway_config([SMALL, BIG])  # the baseline: the dearest output, big
DAY = date(2026, 11, 25)


def ctx(served_by: str | None = "small", *, started: bool = True, cache: str | None = None,
        prompt: int | None = 1000, completion: int | None = 500, cached: int = 0) -> RequestContext:
    c = request_context(CONFIG, {"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    c.route.tier = {"small": SMALL, "big": BIG}.get(served_by or "")
    c.upstream.upstream_started = started
    c.cache = cache  # type: ignore[assignment]
    c.upstream.prompt_tokens, c.upstream.completion_tokens, c.upstream.cached_tokens = prompt, completion, cached
    return c


def test_a_served_request_costs_its_tokens_against_the_baseline() -> None:
    assert CONFIG.baseline.name == "big"
    assert _prices(ctx(), DAY) == pytest.approx((0.0005, 0.0, 0.0105))  # (200 + 300) vs (3000 + 7500) / 1e6


@pytest.mark.parametrize("cache", ["hit", "semantic_hit"])
def test_a_cache_hit_costs_nothing_and_avoided_its_price(cache: str) -> None:
    assert _prices(ctx(started=False, cache=cache), DAY) == pytest.approx((0.0, 0.0005, 0.0105))


def test_a_miss_that_reached_no_backend_costs_nothing() -> None:
    assert _prices(ctx(started=False, cache="miss"), DAY) == (0.0, 0.0, 0.0)
    assert _prices(ctx(None), DAY) == (0.0, 0.0, 0.0)  # no tier: refused before routing
    assert _prices(ctx(None, cache="hit"), DAY) == (0.0, 0.0, 0.0)


def test_a_request_priced_without_an_upstream_start_is_priced() -> None:
    c = ctx(started=False)
    c.result.priced_from = "prompt_only"  # type: ignore[assignment]
    assert _prices(c, DAY) == pytest.approx((0.0005, 0.0, 0.0105))


def test_missing_counts_are_zero_tokens() -> None:
    assert _prices(ctx(prompt=None), DAY) == pytest.approx((0.0003, 0.0, 0.0075))
    assert _prices(ctx(completion=None), DAY) == pytest.approx((0.0002, 0.0, 0.003))


def test_served_on_the_baseline_tier_the_baseline_is_the_cost() -> None:
    assert _prices(ctx("big"), DAY) == pytest.approx((0.0105, 0.0, 0.0105))


def test_cached_prompt_tokens_reach_the_price() -> None:
    cheap_cache = tier("cc", ["http://127.0.0.1:9/v1"], input_per_mtok=1.0, output_per_mtok=1.0)
    c = ctx()
    c.route.tier = cheap_cache.model_copy(update={"prices": cheap_cache.prices.model_copy(  # type: ignore[union-attr]
        update={"cached_input_per_mtok": 0.0})})
    c.upstream.cached_tokens = 400
    cost, _, baseline = _prices(c, DAY)
    assert cost == pytest.approx((600 + 500) / 1e6)
    assert baseline == pytest.approx(0.0105)  # big has no cached rate: its input rate


def test_the_prices_of_the_day_served() -> None:
    from gateway.config.routes import Prices

    def dated(t: object, later: float) -> object:
        first = t.prices  # type: ignore[attr-defined]
        change = Prices(effective_from=date(2026, 6, 1), input_per_mtok=first.input_per_mtok * later,
                        output_per_mtok=first.output_per_mtok * later)
        return t.model_copy(update={"prices": (first, change)})  # type: ignore[attr-defined]

    small, big = dated(SMALL, 2.0), dated(BIG, 10.0)
    config = gateway_config([small, big])  # type: ignore[list-item]
    c = ctx()
    c.config, c.route.tier = config, small  # type: ignore[assignment]
    assert _prices(c, date(2026, 5, 31)) == pytest.approx((0.0005, 0.0, 0.0105))
    assert _prices(c, date(2026, 6, 1)) == pytest.approx((0.001, 0.0, 0.105))  # both tiers at the day's prices


def test_an_escalated_answer_also_pays_for_its_first_part() -> None:
    from gateway.routing.escalate import Escalation

    c = ctx("big")
    c.escalation = Escalation(rule=None, confidence=0.2, from_tier=SMALL, from_replica="small-0",  # type: ignore[arg-type]
                              prompt_tokens=100, completion_tokens=50, cached_tokens=0, first_ms=10.0)
    first_small = (100 * 0.2 + 50 * 0.6) / 1e6  # the first part on its own tier
    first_big = (100 * 3.0 + 50 * 15.0) / 1e6  # and on the baseline's prices
    assert _prices(c, DAY) == pytest.approx((0.0105 + first_small, 0.0, 0.0105 + first_big))
    kept = ctx("big")
    kept.escalation = Escalation(rule=None, confidence=0.9, from_tier=SMALL, from_replica="small-0",  # type: ignore[arg-type]
                                 prompt_tokens=100, completion_tokens=50, cached_tokens=0, first_ms=10.0,
                                 outcome="kept")
    assert _prices(kept, DAY) == pytest.approx((0.0105, 0.0, 0.0105))
