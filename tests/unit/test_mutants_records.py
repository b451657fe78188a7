"""Reading request and shadow lines back (issue 42: mutants of gateway/accounting/records.py that the cost
report's tests let survive): every field a record takes, every missing or mistyped field named, money read
as written (and where the raw text cannot be trusted, as parsed), shadow lines as one or two spend records."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import orjson
import pytest

from gateway.accounting.records import Malformed, Record, Skip, console_text, explain, parse_line

BASE: dict[str, Any] = {
    "event": "request", "ts": "2026-11-25T15:22:26.123+00:00", "tenant": "acme", "tier": "small", "status": 200,
    "prompt_tokens": 12, "completion_tokens": 30, "cache": "miss", "ttft_ms": 12.5, "e2e_ms": 80.25,
    "cost_usd": 0.25,
}


def line(**fields: Any) -> bytes:
    obj = {**BASE, **fields}
    return orjson.dumps({k: v for k, v in obj.items() if v is not DROP})


DROP: Any = object()


def record(raw: bytes) -> Record:
    parsed = parse_line(raw)
    assert isinstance(parsed, Record), parsed
    return parsed


def test_a_request_line_gives_every_field() -> None:
    r = record(line(baseline_cost_usd=1.5, avoided_cost_usd=0.125, session="s-1"))
    assert r == Record(date(2026, 11, 25), "acme", "small", 200, 12, 30, 12.5, 80.25, False, Decimal("0.25"),
                       Decimal("0.125"), Decimal("1.5"), Decimal("1.25"), True, "s-1")


@pytest.mark.parametrize(("cache", "hit"), [("hit", True), ("semantic_hit", True), ("miss", False),
                                            ("bypass", False)])
def test_cache_hits_are_hit_and_semantic_hit(cache: str, hit: bool) -> None:
    assert record(line(cache=cache)).cache_hit is hit


def test_zero_tokens_and_zero_latency_are_values() -> None:
    r = record(line(prompt_tokens=0, completion_tokens=0, ttft_ms=0, e2e_ms=0.0))
    assert (r.prompt_tokens, r.completion_tokens, r.ttft_ms, r.e2e_ms) == (0, 0, 0, 0.0)
    nulls = record(line(ttft_ms=None, e2e_ms=None, tier=None))
    assert (nulls.ttft_ms, nulls.e2e_ms, nulls.tier) == (None, None, None)


def test_a_session_that_is_no_string_is_none() -> None:
    assert record(line(session=5)).session is None
    assert record(line()).session is None


def test_baseline_from_cost_and_saved() -> None:
    r = record(line(cost_usd=0.3, saved_usd=0.2))
    assert (r.baseline, r.saved, r.priced_baseline) == (Decimal("0.5"), Decimal("0.2"), True)
    negative = record(line(cost_usd=0.3, saved_usd=-0.1))  # saved may be negative: a tier dearer than baseline
    assert (negative.baseline, negative.saved) == (Decimal("0.2"), Decimal("-0.1"))


@pytest.mark.parametrize("key", ["tier", "ttft_ms", "e2e_ms", "ts", "status", "cache"])
def test_a_missing_field_is_named(key: str) -> None:
    raw = line(**{key: DROP})
    assert parse_line(raw) is Skip.MISSING_FIELD
    assert explain(raw) == f"missing field: {key}"


@pytest.mark.parametrize(("fields", "named"), [
    ({"prompt_tokens": -1}, "prompt_tokens"),
    ({"completion_tokens": -1}, "completion_tokens"),
    ({"ttft_ms": -0.5}, "ttft_ms"),
    ({"prompt_tokens": 0, "cache": 5}, "cache"),  # a zero count is fine: the broken field is the later one
    ({"prompt_tokens": 1.5}, "prompt_tokens"),
    ({"ts": "yesterday"}, "ts"),
    ({"cost_usd": -0.25}, "cost_usd"),
    ({"cost_usd": "0.25"}, "cost_usd"),  # money as a string is refused, not compared with numbers
    ({"avoided_cost_usd": True}, "avoided_cost_usd"),
])
def test_a_mistyped_field_is_named(fields: dict[str, Any], named: str) -> None:
    raw = line(**fields)
    assert parse_line(raw) is Skip.WRONG_TYPE
    assert explain(raw) == f"wrong type: {named}"


def test_explain_says_ok_or_why_not() -> None:
    assert explain(line()) == "ok"
    assert explain(b"[1, 2]") == "not JSON (not an object)"
    assert explain(b"{nope").startswith("not JSON (")
    assert explain(line(cost_usd=DROP)) == "missing field: cost_usd"


def test_malformed_keeps_its_reason_and_field() -> None:
    exc = Malformed(Skip.WRONG_TYPE, "ts")
    assert (exc.reason, exc.field, str(exc)) == (Skip.WRONG_TYPE, "ts", "wrong type: ts")


def test_console_text_is_a_non_blank_line_that_is_no_object() -> None:
    assert console_text(b"Traceback (most recent call last):\n")
    assert not console_text(b"   \n")
    assert not console_text(b'  {"event": "request"}\n')
    assert parse_line(b"  \n") is Skip.BLANK
    assert parse_line(b"gateway listening on :8080\n") is Skip.TEXT


def test_a_line_with_leading_blanks_is_still_a_record() -> None:
    assert record(b"  " + line()).tenant == "acme"


def test_money_is_the_token_as_written() -> None:
    raw = b'{"cost_usd": 0.10, "meta": {"cost_usd": 9}, ' + line(cost_usd=DROP)[1:]
    assert str(record(raw).cost) == "0.10"  # the first token, the line's own, not the nested one


def test_money_whose_token_does_not_match_falls_back_to_the_parsed_value() -> None:
    nested_first = b'{"meta": {"cost_usd": "x"}, ' + line()[1:]  # the first "cost_usd" has no number
    assert record(nested_first).cost == Decimal("0.25")
    other_first = b'{"meta": {"cost_usd": 9}, ' + line()[1:]  # its number is another's
    assert str(record(other_first).cost) == "0.25"


def test_a_key_not_found_in_the_raw_text_is_read_as_parsed() -> None:
    # the key written with an escape: no raw token to read, so not whatever number sits at some offset
    raw = b'{"abcdef":0.250,"cost\\u005fusd":0.25,' + line(cost_usd=DROP)[1:]
    assert str(record(raw).cost) == "0.25"


@pytest.fixture
def new_york() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    mp.undo()
    time.tzset()


def test_the_day_is_the_utc_day(new_york: None) -> None:
    assert record(line(ts="2026-01-01T23:30:00-05:00")).day == date(2026, 1, 2)
    assert record(line(ts="2026-01-02T01:30:00+02:00")).day == date(2026, 1, 1)
    assert record(line(ts="2026-01-01T23:30:00")).day == date(2026, 1, 1)  # naive: taken as UTC


# --- shadow lines: the gateway's own spend on a comparison (reference tier, and the judge when one graded) ---

SHADOW: dict[str, Any] = {"event": "shadow", "ts": "2026-11-25T10:00:00+00:00", "tenant": "acme",
                          "to_tier": "big", "shadow_cost_usd": 0.5}


def shadow(**fields: Any) -> bytes:
    obj = {**SHADOW, **fields}
    return orjson.dumps({k: v for k, v in obj.items() if v is not DROP})


def spend(tier: str, usd: str) -> Record:
    z = Decimal(0)
    return Record(date(2026, 11, 25), "acme", tier, 200, 0, 0, None, None, False, z, z, z, z, True, None,
                  Decimal(usd), True)


def test_a_shadow_line_with_a_judge_is_two_spend_records() -> None:
    assert parse_line(shadow(judge_tier="judge", judge_cost_usd=0.125)) == (spend("big", "0.375"),
                                                                            spend("judge", "0.125"))
    assert explain(shadow(judge_tier="judge", judge_cost_usd=0.125)) == "ok"


def test_a_shadow_line_without_a_judge_is_one() -> None:
    assert parse_line(shadow()) == (spend("big", "0.5"),)
    assert parse_line(shadow(judge_cost_usd=0.125)) == (spend("big", "0.5"),)  # a cost without a judge: not split
    assert parse_line(shadow(judge_tier="judge", judge_cost_usd=0)) == (spend("big", "0.5"),)
    assert parse_line(shadow(judge_tier="judge")) == (spend("big", "0.5"),)


def test_a_judge_never_costs_more_than_the_whole() -> None:
    assert parse_line(shadow(judge_tier="judge", judge_cost_usd=0.75)) == (spend("big", "0"),
                                                                           spend("judge", "0.5"))


@pytest.mark.parametrize("key", ["ts", "tenant", "to_tier", "shadow_cost_usd"])
def test_a_shadow_line_missing_a_field_names_it(key: str) -> None:
    raw = shadow(**{key: DROP})
    assert parse_line(raw) is Skip.MISSING_FIELD
    assert explain(raw) == f"missing field: {key}"


@pytest.mark.parametrize("key", ["ts", "tenant", "to_tier", "judge_tier"])
def test_a_shadow_line_with_a_mistyped_field_names_it(key: str) -> None:
    raw = shadow(**{key: 7})
    assert parse_line(raw) is Skip.WRONG_TYPE
    assert explain(raw) == f"wrong type: {key}"


@pytest.mark.parametrize(("path", "edge"), [
    (DROP, False),  # a line from before the field: inference
    ("/v1/chat/completions", False),
    ("/v1/completions", False),
    ("/admin/config", True),  # another endpoint: counted apart
    (None, True),  # path: null (a parser refusal)
    (7, True),
])
def test_a_line_of_another_endpoint_is_an_edge_record(path: Any, edge: bool) -> None:
    from gateway.accounting.records import inference_line

    raw = line(path=path)
    assert record(raw).edge is edge
    assert inference_line(orjson.loads(raw)) is not edge
