"""A resumed answer's parts and the resumer's small decisions (gateway/upstream/resume.py), pinned for the resume
target's mutants (issue 42): each part's tokens split back from the request's totals, each part priced on its own
tier with the cached tokens on the last, the work a continuation's sink books (n*P + sum(k_i)), why a stream is not
resumed (the metric, the log line and the words), the tokens the client has, and which replicas come next."""

from __future__ import annotations

from datetime import date
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway.context import RequestContext
from gateway.sse import StreamTally
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context
from gateway.upstream.resume import OUTCOMES, ResumedSink, ResumePart, StreamResumer, part_tokens, priced_parts

SMALL = tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=1.0, output_per_mtok=2.0)
BIG = tier("big", ["http://127.0.0.1:9/v1"], input_per_mtok=10.0, output_per_mtok=20.0)
CONFIG = gateway_config([SMALL, BIG])
DAY = date(2026, 11, 25)


def ctx(parts: list[ResumePart], prompt: int | None, completion: int | None, cached: int = 0) -> RequestContext:
    c = request_context(CONFIG, {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    c.upstream.resumed_parts = parts
    c.upstream.prompt_tokens, c.upstream.completion_tokens, c.upstream.cached_tokens = prompt, completion, cached
    return c


def test_each_parts_tokens_from_the_totals() -> None:
    # P = 100; the parts read 100, 103, 110; sent before them 0, 3, 10; 15 tokens in all
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 3), ResumePart("c", BIG, 10)]
    c = ctx(parts, 100 * 3 + 13, 15)
    assert part_tokens(c) == [(parts[0], 100, 3), (parts[1], 103, 7), (parts[2], 110, 5)]


def test_a_part_cut_before_its_last_count_keeps_what_was_sent() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 4)]
    assert part_tokens(ctx(parts, 2 * 10 + 4, 2)) == [(parts[0], 10, 4), (parts[1], 14, 0)]  # max(2, 4)


def test_missing_totals_count_as_zero() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 2)]
    assert part_tokens(ctx(parts, None, None)) == [(parts[0], -1, 2), (parts[1], 1, 0)]  # (0 - 2) // 2 = -1


def test_each_part_is_priced_on_its_own_tier_with_the_cached_tokens_on_the_last() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("c", BIG, 10)]
    c = ctx(parts, 2 * 1000 + 10, 30, cached=500)
    assert priced_parts(c, DAY) == [
        {"replica": "a", "tier": "small", "prompt_tokens": 1000, "completion_tokens": 10,
         "cost_usd": SMALL.price_at(DAY).cost_usd(1000, 10, 0)},
        {"replica": "c", "tier": "big", "prompt_tokens": 1010, "completion_tokens": 20,
         "cost_usd": BIG.price_at(DAY).cost_usd(1010, 20, 500)},
    ]
    assert priced_parts(c, DAY)[0]["cost_usd"] == pytest.approx((1000 * 1.0 + 10 * 2.0) / 1e6)


def test_cached_tokens_beyond_the_last_parts_prompt_are_capped_at_it() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 2)]
    c = ctx(parts, 2 * 3 + 2, 4, cached=50)
    last = priced_parts(c, DAY)[-1]
    assert last["prompt_tokens"] == 5 and last["cost_usd"] == SMALL.price_at(DAY).cost_usd(5, 2, 5)


class Lease:
    pass


def sink(c: RequestContext, sent: tuple[int, ...]) -> ResumedSink:
    return ResumedSink(c, Lease(), lambda _: None, sent)  # type: ignore[arg-type]


def test_the_work_of_a_resumed_answer_is_every_parts_prompt() -> None:
    c = ctx([], 100, 5)
    sink(c, (0, 3, 10))._as_work()
    assert c.upstream.prompt_tokens == 313
    none = ctx([], None, 5)
    sink(none, (0, 3))._as_work()
    assert none.upstream.prompt_tokens is None


def test_the_backends_usage_is_booked_as_work_when_the_stream_settles() -> None:
    c = ctx([], None, None)
    tally = StreamTally()
    tally.usage = {"prompt_tokens": 20, "completion_tokens": 4}
    s = sink(c, (0, 2))
    s._settle(tally)
    assert (c.upstream.prompt_tokens, c.upstream.completion_tokens) == (20 * 2 + 2, 4)
    s._settle(StreamTally())  # no usage from the backend: nothing booked as work here
    assert c.upstream.prompt_tokens == 42


class Outcome:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> None:
        self.n += 1


def resumer(c: RequestContext, **app: Any) -> tuple[StreamResumer, dict[str, Outcome]]:
    outcomes = {o: Outcome() for o in OUTCOMES}
    return StreamResumer(SimpleNamespace(outcomes=outcomes, **app), c, Lease(), 2), outcomes  # type: ignore[arg-type]


def test_a_stream_not_resumed_is_counted_logged_and_says_why() -> None:
    c = ctx([], None, None)
    r, outcomes = resumer(c)
    with capture_logs() as logs:
        assert r._count("budget", "the retry budget is exhausted") == "the retry budget is exhausted"
    assert {o: n.n for o, n in outcomes.items() if n.n} == {"budget": 1}
    assert logs == [{"event": "stream_not_resumed", "log_level": "warning", "request_id": c.request_id,
                     "why": "the retry budget is exhausted"}]


def test_why_a_stream_is_refused() -> None:
    c = ctx([], None, None)
    r, _ = resumer(c)
    assert r._refusal(StreamTally(text=None)) == "the text sent was not kept"
    assert r._refusal(StreamTally(text=[])) is None
    c.body["n"] = 2
    assert r._refusal(StreamTally(text=[])) == "n > 1"


class Counter:
    def __init__(self, n: int) -> None:
        self.n = n

    def count(self, text: str) -> int:
        return self.n


@pytest.mark.parametrize(("counted", "chunks", "tokens"), [(7, 3, 7), (2, 5, 5), (4, 4, 4)])
def test_the_tokens_the_client_has(counted: int, chunks: int, tokens: int) -> None:
    c = ctx([], None, None)
    c.route.tier = SMALL
    seen: list[Any] = []

    def for_spec(spec: Any) -> Counter:
        seen.append(spec)
        return Counter(counted)

    r, _ = resumer(c, counters=SimpleNamespace(for_spec=for_spec))
    tally = StreamTally(content_chunks=chunks)
    assert r._tokens("text", tally) == tokens
    assert seen == [SMALL.tokenizer]


def test_without_a_tier_the_client_has_a_token_per_chunk() -> None:
    c = ctx([], None, None)
    c.route.tier = None
    r, _ = resumer(c, counters=None)
    assert r._tokens("text", StreamTally(content_chunks=3)) == 3


# -- after the measurement of 2026-11-28: survivors of part_tokens and priced_parts -----------------------------------

CACHED = SMALL.model_copy(update={"prices": SMALL.prices.model_copy(update={"cached_input_per_mtok": 0.1})})


def test_only_the_last_part_gets_the_cached_discount() -> None:
    parts = [ResumePart("a", CACHED, 0), ResumePart("b", CACHED, 2), ResumePart("c", CACHED, 5)]
    c = ctx(parts, 3 * 100 + 7, 9, cached=40)
    prices = CACHED.price_at(DAY)
    assert [p["cost_usd"] for p in priced_parts(c, DAY)] == [
        prices.cost_usd(100, 2, 0), prices.cost_usd(102, 3, 0), prices.cost_usd(105, 4, 40)]


def test_a_prompt_that_does_not_divide_evenly_is_floored() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 1)]
    assert part_tokens(ctx(parts, 2 * 10 + 1 + 1, 3)) == [(parts[0], 10, 1), (parts[1], 11, 2)]  # 21 // 2


def test_the_last_part_ends_at_the_last_sent_count_not_the_second() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 2), ResumePart("c", SMALL, 6)]
    # completion 4 (fewer than sent: a count lost) -> the last part ends at what was sent before it (6)
    assert part_tokens(ctx(parts, 3 * 10 + 8, 4))[-1] == (parts[2], 16, 0)


def test_no_prompt_count_is_zero_not_one() -> None:
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 0)]
    assert [p[1] for p in part_tokens(ctx(parts, None, 1))] == [0, 0]
    assert part_tokens(ctx(parts, None, None))[-1][2] == 0


# -- after the measurement of 2026-11-28 (second run): part_tokens, priced_parts, _tokens -----------------------------

_FIRST = SMALL.price_at(DAY)
DATED = SMALL.model_copy(update={"prices": (
    _FIRST, _FIRST.model_copy(update={"effective_from": date(2026, 11, 1), "input_per_mtok": 5.0}))})


def test_each_part_is_priced_at_the_days_prices() -> None:
    """A tier whose prices changed on Nov 1: the parts of an answer on Nov 25 are priced at the new ones."""
    parts = [ResumePart("a", DATED, 0), ResumePart("b", DATED, 2)]
    c = ctx(parts, 2 * 1000 + 2, 4)
    assert [p["cost_usd"] for p in priced_parts(c, DAY)] == pytest.approx([(1000 * 5.0 + 2 * 2.0) / 1e6,
                                                                           (1002 * 5.0 + 2 * 2.0) / 1e6])


def test_no_prompt_count_is_zero_before_the_sent_tokens_are_taken_off() -> None:
    """No prompt count: 0 (not 1) less the tokens sent, shared by the parts: (0 - 1) // 2 = -1."""
    parts = [ResumePart("a", SMALL, 0), ResumePart("b", SMALL, 1)]
    assert [p[1] for p in part_tokens(ctx(parts, None, 3))] == [-1, 0]


def test_without_a_tier_and_no_chunk_the_client_has_no_token() -> None:
    """No tier (no tokenizer): the tokens sent are the content chunks alone, 0 when none came (not 1)."""
    c = ctx([], None, None)
    c.route.tier = None
    r, _ = resumer(c, counters=None)
    assert r._tokens("", StreamTally(content_chunks=0)) == 0
