"""What a request costs, to the nano-dollar (issue 42: mutants of `Prices.cost_usd`, its validator and the
dated price list that the accounting tests let survive): prompt tokens at the input rate, those served from
the prefix cache at the cached rate (never more of them than the prompt), output tokens at the output rate;
or a share of a GPU hour at the tier's measured throughput."""

from __future__ import annotations

from datetime import date

import pytest
from pydantic import ValidationError

from gateway.config.routes import Prices, Tier


def prices(**fields: object) -> Prices:
    return Prices.model_validate(fields)


def test_tokens_at_their_rates() -> None:
    p = prices(input_per_mtok=2.0, output_per_mtok=10.0)
    assert p.cost_usd(1000, 500) == pytest.approx(0.007, abs=0)  # (1000 * 2 + 500 * 10) / 1e6
    assert p.cost_usd(1000, 0) == 0.002
    assert p.cost_usd(0, 500) == 0.005
    assert p.cost_usd(0, 0) == 0.0


def test_cached_prompt_tokens_at_the_cached_rate() -> None:
    p = prices(input_per_mtok=2.0, output_per_mtok=10.0, cached_input_per_mtok=0.5)
    assert p.cost_usd(1000, 500, 400) == 0.0064  # 600 * 2 + 400 * 0.5 + 500 * 10
    assert p.cost_usd(1000, 500, 0) == 0.007
    assert p.cost_usd(1000, 500, cached_tokens=1000) == 0.0055  # the whole prompt cached


def test_no_more_cached_tokens_than_the_prompt() -> None:
    p = prices(input_per_mtok=2.0, output_per_mtok=10.0, cached_input_per_mtok=0.5)
    assert p.cost_usd(100, 0, 250) == 0.00005  # 100 at 0.5, not 250 (nor a negative 150 at 2)
    assert p.cost_usd(100, 10, 101) == p.cost_usd(100, 10, 100)


def test_without_a_cached_rate_cached_tokens_cost_the_input_rate() -> None:
    p = prices(input_per_mtok=2.0, output_per_mtok=10.0)
    assert p.cost_usd(1000, 500, 400) == p.cost_usd(1000, 500) == 0.007


def test_a_free_cached_rate_is_a_rate_not_a_missing_one() -> None:
    p = prices(input_per_mtok=2.0, output_per_mtok=10.0, cached_input_per_mtok=0.0)
    assert p.cost_usd(1000, 0, 400) == 0.0012  # 600 * 2; the 400 cached cost nothing


def test_rounded_to_a_nano_dollar() -> None:
    p = prices(input_per_mtok=0.0004, output_per_mtok=3.0)
    assert p.cost_usd(1, 0) == 0.0  # 4e-10 USD
    assert p.cost_usd(3, 0) == 0.000000001  # 1.2e-9
    assert prices(input_per_mtok=1.0, output_per_mtok=1.0).cost_usd(1, 2) == 0.000003


def test_gpu_hour_prices_the_seconds_of_a_replica() -> None:
    p = prices(gpu_hour={"usd_per_hour": 3.6, "prefill_tokens_per_s": 1000.0, "decode_tokens_per_s": 100.0})
    assert p.cost_usd(2000, 50) == 0.0025  # (2 s prefill + 0.5 s decode) at 0.001 USD/s
    assert p.cost_usd(2000, 0) == 0.002
    assert p.cost_usd(0, 50) == 0.0005
    assert p.cost_usd(2000, 50, cached_tokens=2000) == 0.0025  # GPU time: the cache is not priced apart
    slow = prices(gpu_hour={"usd_per_hour": 1.0, "prefill_tokens_per_s": 3.0, "decode_tokens_per_s": 7.0})
    assert slow.cost_usd(1, 1) == round((1 / 3 + 1 / 7) / 3600, 9)


@pytest.mark.parametrize("fields", [
    {},
    {"input_per_mtok": 1.0},
    {"output_per_mtok": 1.0},
    {"input_per_mtok": 1.0, "output_per_mtok": 1.0,
     "gpu_hour": {"usd_per_hour": 1.0, "prefill_tokens_per_s": 1.0, "decode_tokens_per_s": 1.0}},
])
def test_one_way_to_price(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="one of the two"):
        prices(**fields)


def test_either_way_alone_is_a_price() -> None:
    assert prices(input_per_mtok=0.0, output_per_mtok=0.0).cost_usd(10, 10) == 0.0
    assert prices(gpu_hour={"usd_per_hour": 0.0, "prefill_tokens_per_s": 1.0, "decode_tokens_per_s": 1.0})


def dated_tier(entries: list[dict[str, object]]) -> Tier:
    return Tier.model_validate({"name": "t", "precision": "int4", "context_window": 8192, "prices": entries,
                                "replicas": [{"name": "t-0", "url": "http://127.0.0.1:1/v1", "model": "m"}]})


def test_the_price_in_force_on_a_day() -> None:
    t = dated_tier([{"input_per_mtok": 1.0, "output_per_mtok": 1.0},
                    {"effective_from": "2026-03-01", "input_per_mtok": 2.0, "output_per_mtok": 2.0},
                    {"effective_from": "2026-06-01", "input_per_mtok": 3.0, "output_per_mtok": 3.0}])
    assert t.price_at(date(2026, 1, 1)).input_per_mtok == 1.0  # the first, before any date
    assert t.price_at(date(2026, 2, 28)).input_per_mtok == 1.0
    assert t.price_at(date(2026, 3, 1)).input_per_mtok == 2.0  # from its day on
    assert t.price_at(date(2026, 5, 31)).input_per_mtok == 2.0
    assert t.price_at(date(2026, 6, 1)).input_per_mtok == 3.0
    assert t.price_at(date(2027, 1, 1)).input_per_mtok == 3.0
    single = dated_tier([{"input_per_mtok": 5.0, "output_per_mtok": 1.0}])
    assert single.price_at(date(2000, 1, 1)).input_per_mtok == 5.0


def test_a_first_entry_with_a_date_still_serves_the_days_before_it() -> None:
    t = dated_tier([{"effective_from": "2026-03-01", "input_per_mtok": 1.0, "output_per_mtok": 1.0},
                    {"effective_from": "2026-04-01", "input_per_mtok": 2.0, "output_per_mtok": 2.0}])
    assert t.price_at(date(2026, 1, 1)).input_per_mtok == 1.0
    assert t.price_at(date(2026, 4, 1)).input_per_mtok == 2.0


def test_one_price_serves_every_day() -> None:
    t = Tier.model_validate({"name": "t", "precision": "int4", "context_window": 8192,
                             "prices": {"input_per_mtok": 4.0, "output_per_mtok": 1.0},
                             "replicas": [{"name": "t-0", "url": "http://127.0.0.1:1/v1", "model": "m"}]})
    assert t.price_at(date(1999, 1, 1)).input_per_mtok == 4.0


@pytest.mark.parametrize(("entries", "message"), [
    ([], "at least one price"),
    ([{"input_per_mtok": 1.0, "output_per_mtok": 1.0}, {"input_per_mtok": 2.0, "output_per_mtok": 2.0}],
     "effective_from on all but the first"),
    ([{"input_per_mtok": 1.0, "output_per_mtok": 1.0},
      {"effective_from": "2026-06-01", "input_per_mtok": 2.0, "output_per_mtok": 2.0},
      {"effective_from": "2026-03-01", "input_per_mtok": 3.0, "output_per_mtok": 3.0}], "increasing order"),
    ([{"input_per_mtok": 1.0, "output_per_mtok": 1.0},
      {"effective_from": "2026-03-01", "input_per_mtok": 2.0, "output_per_mtok": 2.0},
      {"effective_from": "2026-03-01", "input_per_mtok": 3.0, "output_per_mtok": 3.0}], "increasing order"),
])
def test_a_price_list_is_dated_in_order(entries: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        dated_tier(entries)


def test_a_dated_list_in_order_is_kept_as_given() -> None:
    entries = [{"input_per_mtok": 1.0, "output_per_mtok": 1.0},
               {"effective_from": "2026-03-01", "input_per_mtok": 2.0, "output_per_mtok": 2.0}]
    t = dated_tier(entries)
    assert isinstance(t.prices, tuple) and [p.input_per_mtok for p in t.prices] == [1.0, 2.0]


def test_nano_usd_is_round_to_nine_digits_but_for_ties_within_a_float_s_error() -> None:
    """`nano_usd` (round(x * 1e9) / 1e9, the cheaper form) gives round(x, 9) for every price a request line holds:
    tokens up to 200,000 at rates with cents, and the differences of two such prices (saved_usd); they could
    differ by one nano-dollar only at a tie within a float's error, which none of these meets."""
    from random import Random

    from gateway.config.routes import nano_usd
    rng = Random(7)
    rates = [0.0, 0.01, 0.05, 0.15, 0.2, 0.6, 1.25, 2.5, 3.0, 10.0, 15.0, 75.0]
    for _ in range(20_000):
        total = rng.randrange(200_000) * rng.choice(rates) + rng.randrange(200_000) * rng.choice(rates)
        usd = total / 1_000_000
        other = rng.randrange(2_000) * rng.choice(rates) / 1_000_000
        assert nano_usd(usd) == round(usd, 9) and nano_usd(usd - other) == round(usd - other, 9)
    assert nano_usd(0.0000012345) == 0.000001234 or nano_usd(0.0000012345) == 0.000001235
    assert nano_usd(1.23456789049) == 1.23456789 and nano_usd(-2.5e-10) == 0.0
