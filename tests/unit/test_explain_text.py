"""`gateway route explain` for people (issue 30): one readable fact a line (no JSON in a `key: value` line), each
option's help with a description and its default, and the cache line saying which of its conditions failed;
with quality_floor, each tier's predicted quality and price and why the tier was chosen (issue 33)."""

from __future__ import annotations

import argparse
from typing import Any


from gateway.cli import _parser
from gateway.config.policies import CacheRule
from gateway.routing.explain import explain
from gateway.routing.explain_text import lines
from gateway.testing import TableQualityPredictor, TableScorer, gateway_config, tier

BANDS = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}


def config(policy: dict[str, Any]) -> Any:
    tiers = [tier("small", ["http://127.0.0.1:1/v1"], output_per_mtok=1.0, quality_model="m7b"),
             tier("large", ["http://127.0.0.1:1/v1"], output_per_mtok=8.0, quality_model="m51b")]
    return gateway_config(tiers, policy={"routing": BANDS, "rate_limit": {"requests_per_min": 60},
                                         "output_cap": {"tokens": 100}, **policy})


def body(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "auto", "messages": [{"role": "user", "content": prompt}], **extra}


def assert_readable(text: list[str]) -> None:
    for line in text:
        key, _, value = line.partition(": ")
        assert key.strip() and value, line
        assert not any(c in value for c in "{}[]\""), f"JSON in a line: {line}"


async def test_each_fact_is_one_readable_line() -> None:
    report = await explain(config({}), "test-tenant", body("prove it", temperature=0.7, n=2),
                           scorer=TableScorer({"prove it": 0.9}))
    text = lines(report)
    assert_readable(text)
    facts = dict((k.strip(), v) for k, _, v in (line.partition(": ") for line in text))
    assert facts["rate limit"] == "60 requests/min" and facts["output cap"] == "100 tokens"
    assert facts["difficulty"] == "0.9" and facts["tier"] == "large"
    assert facts["why this tier"] == "band: difficulty 0.9000 -> large"
    assert facts["decision"] == "200: tier large, replica large-0"
    assert [line.split(": ", 1)[1] for line in text if line.strip().startswith("band:")] == [
        "difficulty below 0.5 -> small", "difficulty up to 1.0 -> large"]


async def test_the_cache_line_says_which_conditions_failed() -> None:
    report = await explain(config({}), "test-tenant", body("x", temperature=0.7, n=2, logprobs=True))
    why = [line.split(": ", 1)[1] for line in lines(report) if line.strip().startswith("not cached as")]
    assert len(why) == 3
    assert "'logprobs'" in why[0] and "2 answers" in why[1] and "temperature is 0.7" in why[2]
    off = await explain(config({"cache": {"enabled": False}}), "test-tenant", body("x", temperature=0))
    assert off["cache"] == {"status": "bypass", "why": ["caching is off for the tenant (cache.enabled: false)"]}


async def test_quality_routing_shows_each_tiers_quality_price_and_why() -> None:
    predictor = TableQualityPredictor({"hi": {"m7b": 0.81, "m51b": 0.84}})
    report = await explain(config({"quality_floor": 0.05}), "test-tenant", body("hi"), predictor=predictor)
    assert report["quality"]["chosen"] == "small" and report["quality"]["best"] == "large"
    text = lines(report)
    assert_readable(text)
    small = next(line for line in text if line.strip().startswith("quality small"))
    large = next(line for line in text if line.strip().startswith("quality large"))
    assert "0.8100, price $" in small and "(chosen)" in small and "(best)" in large
    assert any("within floor 0.05 of the best, large (0.840)" in line for line in text)
    failed = await explain(config({"quality_floor": 0.05}), "test-tenant", body("hi"),
                           predictor=TableQualityPredictor({}, error=RuntimeError("x")))
    assert any("the predictor failed on this prompt" in line for line in lines(failed))
    named = await explain(config({"quality_floor": 0.05}), "test-tenant", {**body("hi"), "model": "large"},
                          predictor=predictor)
    assert named["quality"] is None and named["tier"] == "large" and predictor.calls == ["hi"]


async def test_a_refusal_is_one_line_naming_the_field() -> None:
    report = await explain(config({}), "test-tenant", {**body("x"), "model": "nope"})
    assert lines(report)[-1].endswith("(field model)") and "404: " in lines(report)[-1]


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = action.choices[name]
    return found


def test_every_route_explain_option_has_help_with_its_default() -> None:
    explain_parser = subparser(subparser(_parser(), "route"), "explain")
    options = [a for a in explain_parser._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {"routes", "policies", "tenant", "prompt", "model", "max_tokens", "json"}
    for action in options:
        assert action.help and len(action.help) > 15, action.dest
        assert "default" in action.help or "required" in action.help, action.dest
