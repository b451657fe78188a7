"""Escalation's decision (issue 39): the confidence of an answer, the boundary, which requests may escalate and to
which tier, what the upstream is asked, and both parts priced."""

from __future__ import annotations

import math
from datetime import date
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.config.policies import Escalate
from gateway.context import RequestContext
from gateway.routing.escalate import (
    Escalation, armed, ask_logprobs, client_asked, confidence, escalates, first_cost, log_fields, next_tier,
    strip_logprobs, token_logprobs,
)
from gateway.stages.policy import PolicyStage
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import parsed_context
from gateway.upstream.held import HoldScanner

RULE = Escalate(min_confidence=0.6)


def lp(*probabilities: float) -> list[float]:
    return [math.log(p) for p in probabilities]


# -- the confidence: the geometric mean of the tokens' probabilities

def test_confidence_is_the_geometric_mean_of_the_tokens_probabilities() -> None:
    assert confidence(lp(0.5, 0.5)) == pytest.approx(0.5)
    assert confidence(lp(0.9, 0.1)) == pytest.approx(0.3)  # sqrt(0.09): not the arithmetic mean 0.5
    assert confidence(lp(0.8, 0.8, 0.8, 0.8)) == pytest.approx(0.8)  # length does not lower it
    assert confidence(lp(1.0)) == 1.0
    assert confidence(lp(0.2)) == pytest.approx(0.2)


def test_confidence_edges() -> None:
    assert confidence(None) is None and confidence([]) is None
    assert confidence([-math.inf, 0.0]) == 0.0  # a token of probability 0
    assert confidence([1e-7, math.log(0.25)]) == pytest.approx(0.5)  # a rounding above 0 counts as probability 1
    assert 0.0 <= confidence([-50.0] * 3) <= 1.0  # type: ignore[operator]


def test_token_logprobs_reads_every_shape() -> None:
    chat = {"logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []},
                                     {"token": "b", "logprob": -0.2, "top_logprobs": []}]}}
    vllm_completion = {"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.3, None, -0.4],
                                    "top_logprobs": [], "text_offset": [0, 1]}}
    assert token_logprobs(chat) == [-0.1, -0.2]  # chat, and llama.cpp's completions (the same shape)
    assert token_logprobs(vllm_completion) == [-0.3, -0.4]  # a None (echo's first token) is no token
    assert token_logprobs({"logprobs": None}) is None
    assert token_logprobs({}) is None
    assert token_logprobs({"logprobs": {"content": []}}) is None
    assert token_logprobs({"logprobs": {"content": [{"logprob": True}]}}) is None  # not a number


# -- the boundary

def test_below_the_minimum_escalates_exactly_at_it_does_not() -> None:
    assert escalates(0.5999, RULE)
    assert not escalates(0.6, RULE)
    assert not escalates(0.6001, RULE)
    assert not escalates(None, RULE)  # no confidence measured: kept
    assert not escalates(0.0, Escalate(min_confidence=0.0))  # 0: never
    assert escalates(0.9999, Escalate(min_confidence=1.0)) and not escalates(1.0, Escalate(min_confidence=1.0))


def test_the_rule_is_a_probability() -> None:
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError):
            Escalate(min_confidence=bad)


# -- which requests, and to which tier

def config(escalate: Any = None, allowed: list[str] | None = None) -> Any:
    policy: dict[str, Any] = {"default_tier": "small"}
    if escalate is not None:
        policy["escalate"] = escalate
    if allowed is not None:
        policy["allowed_tiers"] = allowed
    return gateway_config([tier("small", ["http://127.0.0.1:9/v1"]), tier("mid", ["http://127.0.0.1:10/v1"]),
                           tier("large", ["http://127.0.0.1:11/v1"])], policy=policy)


async def context(cfg: Any = None, endpoint: str = "chat", **body: Any) -> RequestContext:
    base: dict[str, Any] = ({"model": "small", "messages": [{"role": "user", "content": "hi"}]} if endpoint == "chat"
                            else {"model": "small", "prompt": "hi"})
    ctx = await parsed_context(cfg or config({"min_confidence": 0.6}), {**base, **body},
                               endpoint=endpoint)  # type: ignore[arg-type]
    await PolicyStage()(ctx)
    ctx.route.tier = ctx.config.tiers["small"]
    return ctx


async def test_a_plain_request_is_armed_to_the_next_tier_up() -> None:
    ctx = await context()
    assert armed(ctx) == RULE
    assert next_tier(ctx) is ctx.config.tiers["mid"]
    assert armed(await context(endpoint="completions")) == RULE


async def test_the_next_tier_is_the_next_the_tenant_may_use() -> None:
    ctx = await context(config({"min_confidence": 0.6}, allowed=["small", "large"]))
    assert next_tier(ctx) is ctx.config.tiers["large"]
    ctx.route.tier = ctx.config.tiers["large"]
    assert next_tier(ctx) is None and armed(ctx) is None  # the top tier has none above


@pytest.mark.parametrize("body", [
    {"stream": True},
    {"n": 2},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
    {"functions": [{"name": "f", "parameters": {"type": "object"}}]},
])
async def test_never_for_streams_several_outputs_or_tools(body: dict[str, Any]) -> None:
    assert armed(await context(**body)) is None


async def test_not_without_a_rule_nor_twice() -> None:
    assert armed(await context(config())) is None
    assert armed(await context(config(False))) is None
    ctx = await context()
    ctx.escalation = Escalation(RULE, 0.1, ctx.config.tiers["small"], "small-0", 5, 4, 0, 10.0)
    assert armed(ctx) is None  # the second hop asks nothing more


def test_the_upstream_is_asked_for_each_tokens_logprob() -> None:
    assert ask_logprobs("chat", {"model": "m"}) == {"model": "m", "logprobs": True, "top_logprobs": 1}
    assert ask_logprobs("completions", {"model": "m"}) == {"model": "m", "logprobs": 1}
    own = {"model": "m", "logprobs": True, "top_logprobs": 5}
    assert ask_logprobs("chat", own) is own and client_asked("chat", own)
    assert ask_logprobs("completions", {"logprobs": 3}) == {"logprobs": 3}
    assert not client_asked("chat", {"logprobs": False}) and not client_asked("completions", {"logprobs": True})


def test_the_client_gets_no_logprobs_it_did_not_ask_for() -> None:
    answer: dict[str, Any] = {"choices": [{"message": {"content": "x"}, "logprobs": {"content": []}}]}
    strip_logprobs(answer)
    assert answer == {"choices": [{"message": {"content": "x"}, "logprobs": None}]}


# -- both parts priced

async def test_both_parts_are_priced_on_their_own_tiers() -> None:
    ctx = await context()
    small = ctx.config.tiers["small"]  # 1 and 2 dollars per million tokens in and out
    ctx.escalation = Escalation(RULE, 0.25, small, "small-0", 100, 10, 0, 12.5)
    day = date(2026, 6, 1)
    assert first_cost(ctx, day) == pytest.approx((100 * 1 + 10 * 2) / 1e6)
    ctx.route.tier, ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens = ctx.config.tiers["mid"], 100, 20
    fields = log_fields(ctx, day, 0.5 + first_cost(ctx, day))  # the request's cost: both parts
    assert fields["escalated_from"] == "small"
    first, second = fields["escalation"]["parts"]
    assert (first["tier"], first["prompt_tokens"], first["completion_tokens"]) == ("small", 100, 10)
    assert first["cost_usd"] == first_cost(ctx, day)
    assert (second["tier"], second["completion_tokens"], second["cost_usd"]) == ("mid", 20, 0.5)
    assert fields["escalation"]["confidence"] == 0.25 and fields["escalation"]["min_confidence"] == 0.6


async def test_a_failed_escalation_is_one_part_and_costs_nothing_more() -> None:
    ctx = await context()
    ctx.escalation = Escalation(RULE, 0.25, ctx.config.tiers["small"], "small-0", 100, 10, 0, 12.5, "failed")
    assert first_cost(ctx, date(2026, 6, 1)) == 0.0  # the first answer is the one served: priced as usual
    fields = log_fields(ctx, date(2026, 6, 1), 0.0)
    assert fields["escalated_from"] is None and fields["escalation"]["outcome"] == "failed"
    assert "parts" not in fields["escalation"]


async def test_a_stream_is_armed_only_with_hold_tokens() -> None:
    assert armed(await context(stream=True)) is None
    held = config({"min_confidence": 0.6, "hold_tokens": 3})
    assert armed(await context(held, stream=True)) == Escalate(min_confidence=0.6, hold_tokens=3)
    assert armed(await context(held, stream=True, n=2)) is None
    with pytest.raises(ValidationError):
        Escalate(min_confidence=0.5, hold_tokens=0)


def chunk(token: str, logprob: float) -> bytes:
    event = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": token}, "logprobs": {"content": [{"token": token, "logprob": logprob}]},
         "finish_reason": None}]}
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("strip", [True, False])
def test_the_hold_scanner_reads_each_tokens_logprob_and_strips_it_unless_asked(strip: bool) -> None:
    logprobs: list[float] = []
    scanner = HoldScanner("chat", forward_usage=False, logprobs=logprobs, strip=strip)
    out = scanner.feed(chunk("a", -0.5)) + scanner.feed(chunk("b", -1.5) + chunk("c", -0.25))
    assert logprobs == [-0.5, -1.5, -0.25]
    events = [orjson.loads(line[6:]) for line in out.split(b"\n\n") if line]
    assert [e["choices"][0]["delta"]["content"] for e in events] == ["a", "b", "c"]
    assert all((e["choices"][0]["logprobs"] is None) == strip for e in events)
    assert scanner.tally.content_chunks == 3


def test_the_least_likely_token_measure() -> None:
    assert confidence(lp(0.9, 0.1, 0.9), "least_token") == pytest.approx(0.1)
    assert confidence(lp(0.9, 0.1, 0.9)) == pytest.approx((0.9 * 0.1 * 0.9) ** (1 / 3))
    assert confidence([-math.inf], "least_token") == 0.0 and confidence([], "least_token") is None
    assert Escalate(min_confidence=0.5).measure == "geometric_mean"
    with pytest.raises(ValidationError):
        Escalate(min_confidence=0.5, measure="arithmetic")  # type: ignore[arg-type]
