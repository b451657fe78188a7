"""The cache's rules read word for word (issue 42: mutants of gateway/cache/keys.py that the reading's tests let
survive): each reason a request is not cached, as `gateway explain` shows it, in order; which requests are
deterministic; the keys' shape and what separates them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.cache.keys import SHARED_SCOPE, cacheable, response_key, scope_of, semantic_namespace, uncached_reasons
from gateway.config.policies import CacheRule
from gateway.reading import Reading, read
from gateway.types import Endpoint

ALWAYS = CacheRule(enabled=True, mode="always")
DETERMINISTIC = CacheRule(enabled=True, mode="deterministic")


def reading(endpoint: Endpoint, body: dict[str, Any]) -> Reading:
    r = read(endpoint, body)
    r.limit(32, r.stop)
    return r


def chat(**fields: Any) -> Reading:
    return reading("chat", {"model": "auto", "messages": [{"role": "user", "content": "hi"}], **fields})


NOT_DETERMINISTIC = ("not deterministic: temperature is {} (not 0) and there is no integer seed "
                     "(cache.mode: deterministic caches only those)")


def test_every_reason_in_order_word_for_word() -> None:
    r = reading("completions", {"prompt": ["a", "b"], "echo": True, "logprobs": 2, "temperature": 0.5,
                                "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert uncached_reasons(r, CacheRule(enabled=False, mode="deterministic")) == [
        "caching is off for the tenant (cache.enabled: false)",
        "the request sets 'logprobs', whose answers a stored text cannot replay",
        "the request sets 'echo', whose answers a stored text cannot replay",
        "the request offers tools, whose calls a stored text cannot replay",
        "it asks for 2 answers (prompts x n, best_of): only single answers (n = 1, one prompt) are cached",
        NOT_DETERMINISTIC.format("0.5"),
    ]


def test_embeddings_are_not_cached_as_answers() -> None:
    assert uncached_reasons(reading("embeddings", {"input": "a"}), ALWAYS) == [
        "embeddings are cached per input by the embedding cache, not as answers"]


def test_a_replayable_deterministic_request_has_no_reason() -> None:
    assert uncached_reasons(chat(temperature=0), DETERMINISTIC) == []
    assert uncached_reasons(chat(seed=7), DETERMINISTIC) == []
    assert uncached_reasons(chat(temperature=0.9), ALWAYS) == []  # mode always: any request
    assert uncached_reasons(chat(logprobs=False, echo=None), ALWAYS) == []  # unset is not set
    assert cacheable(chat(seed=0), DETERMINISTIC)


@pytest.mark.parametrize(("fields", "shown"), [({}, "not set"), ({"temperature": 0.7}, "0.7"),
                                               ({"temperature": 1}, "1"), ({"seed": True}, "not set"),
                                               ({"seed": 1.5, "temperature": 2}, "2")])
def test_not_deterministic_says_what_the_temperature_was(fields: dict[str, Any], shown: str) -> None:
    assert uncached_reasons(chat(**fields), DETERMINISTIC) == [NOT_DETERMINISTIC.format(shown)]
    assert not cacheable(chat(**fields), DETERMINISTIC)


def test_scope_is_the_tenant_unless_shared() -> None:
    assert scope_of("acme", DETERMINISTIC) == "acme"
    assert scope_of("acme", CacheRule(shared=True)) == SHARED_SCOPE == "*shared*"


def test_keys_have_their_shape_and_are_stable() -> None:
    one = response_key("acme", "small", chat(temperature=0))
    assert one.startswith("resp:") and len(one) == 5 + 64
    assert one == response_key("acme", "small", chat(temperature=0))
    namespace = semantic_namespace("acme", "small", chat(temperature=0))
    assert len(namespace) == 32 and int(namespace, 16) >= 0
    assert namespace == semantic_namespace("acme", "small", chat(temperature=0))


def test_the_semantic_namespace_separates_scope_tier_and_parameters() -> None:
    base = semantic_namespace("acme", "small", chat(temperature=0))
    assert base != semantic_namespace("other", "small", chat(temperature=0))
    assert base != semantic_namespace("acme", "large", chat(temperature=0))
    assert base != semantic_namespace("acme", "small", chat(temperature=0, max_tokens=5, seed=1))
    paraphrase = reading("chat", {"messages": [{"role": "user", "content": "hello there"}], "temperature": 0})
    assert base == semantic_namespace("acme", "small", paraphrase)  # only the last user text differs


@pytest.mark.parametrize("made", [
    chat(), chat(temperature=0), chat(temperature=0.0), chat(temperature=0.7), chat(seed=7), chat(seed=True),
    chat(seed=7, temperature=1.2), chat(n=2), chat(logprobs=True), chat(top_logprobs=3, temperature=0),
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}], temperature=0),
    reading("completions", {"prompt": ["a", "b"], "temperature": 0}), reading("completions", {"prompt": "a", "echo": True}),
    reading("completions", {"prompt": "a", "best_of": 3, "seed": 1}), reading("embeddings", {"input": "a"}),
], ids=lambda r: f"{r.endpoint}:{sorted(r.params)}:{r.generated}")
def test_the_log_lines_cache_class_is_what_the_reasons_say(made: Reading) -> None:
    """`Reading.cache_class` (the log line's one-pass verdict, read by `gateway whatif`) agrees with `uncached_reasons`
    under both modes: never (cached in neither), deterministic (in both), always (only in mode always)."""
    in_always, in_deterministic = not uncached_reasons(made, ALWAYS), not uncached_reasons(made, DETERMINISTIC)
    expected = "deterministic" if in_deterministic else "always" if in_always else "never"
    assert made.cache_class == expected
    # `cacheable` (the cache stage's question, per request) is the reasons' verdict, in every mode
    for rule in (ALWAYS, DETERMINISTIC, CacheRule(enabled=False, mode="always"), CacheRule(enabled=False)):
        assert cacheable(made, rule) is not bool(uncached_reasons(made, rule)), rule
