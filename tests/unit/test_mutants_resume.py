"""The continuation of a broken stream (gateway/upstream/continuation.py), pinned exactly for the resume target's
mutants (issue 42): the continuation request body field by field, why a request is never resumed word for word,
and the splice (`ContinuationScanner`): the events' bytes, the usage the client is sent, a chat continued on
/completions. test_resume_pieces.py tells the story; these pin the values.

Then the resuming itself step by step (gateway/upstream/resume.py), with fakes for the attempt, the pool and the
retry budget: `StreamResumer.resume` (the lease released as failed with the count sent, a whole answer, the
refusal, the attempts and the budget, the continuation body and where it is posted, a failed attempt's log line),
`_switch` (the parts recorded, the `stream_resumed` line, the continuation handed over), `_candidates` (the tier's
other replicas, then the later tiers of its endpoint the tenant may use), `StreamResumes.template` (llama.cpp's
/apply-template, a server without it remembered), `for_request` and the outcome counter. test_resume
(integration) reaches these through real streams and checks the outcome, not each step."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from structlog.testing import capture_logs

import gateway.upstream.resume as resume_module
from gateway.backends.upstream import Retry
from gateway.config import Tier
from gateway.config.policies import Resume
from gateway.errors import UpstreamError, UpstreamStatus
from gateway.keyspace import cache_salt
from gateway.metrics import GatewayMetrics
from gateway.sse import OutputLimit, SseScanner
from gateway.stages.parse import ParseStage
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context
from gateway.upstream.continuation import ContinuationScanner, continuation_body, not_resumable
from gateway.upstream.resume import OUTCOMES, ResumedSink, ResumePart, StreamResumer, StreamResumes

MESSAGES = [{"role": "user", "content": "hi"}]
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a"}
OTHER = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 9, "model": "b"}


def events(*chunks: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)


def parsed(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]


def first_part(endpoint: str = "chat", *, forward_usage: bool = True, limit: OutputLimit | None = None) -> SseScanner:
    scanner = SseScanner(endpoint, forward_usage=forward_usage, collect_text=True, limit=limit)  # type: ignore[arg-type]
    if endpoint == "chat":
        scanner.feed(events({**HEAD, "choices": [{"index": 0, "delta": {"content": " one"}}]}))
    else:
        scanner.feed(events({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "a",
                             "choices": [{"index": 0, "text": " one"}]}))
    return scanner


# -- continuation_body ---------------------------------------------------------------------------------------------

def test_a_chat_continuation_body_exactly() -> None:
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 40, "stream": True, "temperature": 0.5}
    assert continuation_body("chat", body, " so far", 3, 37) == {
        "model": "m", "messages": [*MESSAGES, {"role": "assistant", "content": " so far"}], "stream": True,
        "temperature": 0.5, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 37}


def test_a_completions_continuation_body_exactly() -> None:
    body = {"model": "m", "prompt": "Once", "echo": False, "max_tokens": 9}
    assert continuation_body("completions", body, " upon", 1, 8) == {"model": "m", "prompt": "Once upon",
                                                                     "max_tokens": 8}


def test_a_chat_on_completions_body_exactly() -> None:
    body = {"model": "m", "messages": MESSAGES, "tools": [], "tool_choice": "none", "logprobs": True,
            "max_completion_tokens": 20, "stream": True, "response_format": {"type": "json_object"}}
    assert continuation_body("chat", body, " x", 2, 18, template="<t>") == {
        "model": "m", "stream": True, "response_format": {"type": "json_object"}, "prompt": "<t> x", "max_tokens": 18}


@pytest.mark.parametrize(("asked", "sent", "left"), [(10, 3, 7), (3, 3, 0), (2, 5, 0), (0, 0, 0)])
def test_min_tokens_drop_by_the_tokens_sent_and_never_below_zero(asked: int, sent: int, left: int) -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, "min_tokens": asked}, "x", sent, None)
    assert body["min_tokens"] == left


def test_min_tokens_that_are_no_number_are_left_alone() -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, "min_tokens": "5"}, "x", 3, None)
    assert body["min_tokens"] == "5"


@pytest.mark.parametrize(("asked", "left", "expected"), [
    ({"max_tokens": 10}, 7, {"max_tokens": 7}),
    ({"max_completion_tokens": 10}, 7, {"max_tokens": 7, "max_completion_tokens": 7}),
    ({"max_completion_tokens": None, "max_tokens": 10}, 7, {"max_tokens": 7}),
    ({"max_completion_tokens": 10, "max_tokens": 10}, None, {}),
    ({}, None, {}),
])
def test_the_limits_of_a_continuation(asked: dict, left: int | None, expected: dict) -> None:
    body = continuation_body("chat", {"model": "m", "messages": MESSAGES, **asked}, "x", 3, left)
    assert {k: v for k, v in body.items() if k in ("max_tokens", "max_completion_tokens")} == expected


# -- not_resumable ---------------------------------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(("endpoint", "body", "why"), [
    ("chat", {"messages": MESSAGES, "n": 2}, "n > 1"),
    ("completions", {"prompt": "p", "n": 3}, "n > 1"),
    ("chat", {"messages": MESSAGES, "n": 1}, None),
    ("chat", {"messages": MESSAGES, "n": "2"}, None),
    ("chat", {"messages": MESSAGES, "tools": TOOLS}, "the request offers tools (a tool call may be half sent)"),
    ("chat", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "auto"},
     "the request offers tools (a tool call may be half sent)"),
    ("chat", {"messages": MESSAGES, "tools": TOOLS, "tool_choice": "none"}, None),
    ("chat", {"messages": MESSAGES, "tools": []}, None),
    ("chat", {"messages": MESSAGES, "functions": [{"name": "f"}]},
     "the request offers functions (a call may be half sent)"),
    ("chat", {"messages": MESSAGES, "functions": []}, None),
    ("completions", {"prompt": ["a", "b"]}, "the prompt is not a single string"),
    ("completions", {"prompt": [1, 2]}, "the prompt is not a single string"),
    ("completions", {"prompt": "p", "tools": TOOLS, "functions": [{"name": "f"}]}, None),
    ("chat", {"messages": MESSAGES, "prompt": ["a"]}, None),
])
def test_why_a_request_is_never_resumed_word_for_word(endpoint: str, body: dict, why: str | None) -> None:
    assert not_resumable(endpoint, body) == why  # type: ignore[arg-type]


# -- ContinuationScanner -----------------------------------------------------------------------------------------------

def test_the_spliced_events_bytes_exactly() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": " two"}}]}))
    assert out == b"data: " + orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": " two"}}]}) + b"\n\n"


def test_the_continuation_shares_the_answers_tally_and_forgets_the_first_parts_usage() -> None:
    first = first_part()
    first.feed(events({**HEAD, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}))
    assert first.tally.usage is not None
    spliced = ContinuationScanner(first, (0, 1))
    assert spliced.tally is first.tally and spliced.tally.usage is None
    assert spliced.endpoint == "chat" and spliced.forward_usage is True


def test_the_continuation_keeps_the_first_parts_cap() -> None:
    first = first_part(limit=OutputLimit(tokens=None, chars=6))
    spliced = ContinuationScanner(first, (0, 1))
    assert spliced.limit == first.limit
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": " two three"}}]}))
    assert parsed(out)[0]["choices"][0]["delta"]["content"] == " t"  # 4 + 2 = the 6 characters
    assert spliced.tally.capped


def test_the_continuation_drops_a_usage_chunk_the_first_part_would_not_forward() -> None:
    spliced = ContinuationScanner(first_part(forward_usage=False), (0, 1))
    assert spliced.forward_usage is False
    out = spliced.feed(events({**OTHER, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                                                "total_tokens": 11}}))
    assert out == b""
    assert spliced.tally.usage == {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11}


@pytest.mark.parametrize(("delta", "extra", "kept"), [
    ({"role": "assistant", "content": ""}, {}, None),
    ({"role": "assistant"}, {}, None),
    ({"role": "assistant", "content": "hey"}, {}, {"content": "hey"}),
    ({"role": "assistant", "content": ""}, {"finish_reason": "stop"}, {"content": ""}),
    ({"role": "assistant", "tool_calls": [{"index": 0}]}, {}, {"tool_calls": [{"index": 0}]}),
])
def test_the_opening_role_chunk_of_a_continuation(delta: dict, extra: dict, kept: dict | None) -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": delta, **extra}]}))
    if kept is None:
        assert out == b""
    else:
        (event,) = parsed(out)
        assert event["choices"][0]["delta"] == kept and event["id"] == "chatcmpl-1"


def test_a_role_chunk_carrying_usage_is_kept() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                               "usage": {"prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}}))
    (event,) = parsed(out)
    assert event["choices"][0]["delta"] == {}
    assert event["usage"] == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def test_only_the_first_choice_loses_its_role() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1))
    out = spliced.feed(events({**OTHER, "choices": [{"index": 0, "delta": {"content": "a"}},
                                                   {"index": 1, "delta": {"role": "assistant", "content": ""}}]}))
    (event,) = parsed(out)
    assert event["choices"][1]["delta"] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(("sent", "usage", "merged"), [
    # the last part's sent count (5) comes off the prompt and onto the completion; never the second part's (2)
    ((0, 2, 5), {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24},
     {"prompt_tokens": 15, "completion_tokens": 9, "total_tokens": 24}),
    ((0, 7), {"prompt_tokens": 3, "completion_tokens": 1}, {"prompt_tokens": 0, "completion_tokens": 8,
                                                            "total_tokens": 8}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 11}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 10}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 10, "x": 1}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
      "prompt_tokens_details": {"cached_tokens": 10, "x": 1}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 4}}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": 1, "prompt_tokens_details": None},
     {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": None}),
    ((0, 2), {"prompt_tokens": 12, "completion_tokens": None}, {"prompt_tokens": 12, "completion_tokens": None}),
    ((0, 2), {"prompt_tokens": "12", "completion_tokens": 1}, {"prompt_tokens": "12", "completion_tokens": 1}),
])
def test_the_usage_the_client_is_sent(sent: tuple[int, ...], usage: dict, merged: dict) -> None:
    spliced = ContinuationScanner(first_part(), sent)
    out = spliced.feed(events({**OTHER, "choices": [], "usage": usage}))
    (event,) = parsed(out)
    assert event["usage"] == merged
    assert {k: event[k] for k in HEAD} == HEAD


@pytest.mark.parametrize(("choice", "delta", "finish"), [
    ({"index": 0, "text": " two", "finish_reason": None}, {"content": " two"}, None),
    ({"text": " two"}, {"content": " two"}, None),
    ({"index": 0, "text": "", "finish_reason": "length"}, {}, "length"),
    ({"index": 0, "finish_reason": "stop"}, {}, "stop"),
])
def test_a_completion_choice_becomes_a_chat_choice_exactly(choice: dict, delta: dict, finish: str | None) -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": [choice, "not a choice"]}))
    (event,) = parsed(out)
    assert event == {**HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def test_a_second_choice_keeps_its_index_when_made_a_chat_choice() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": [{"index": 0, "text": "a"}, {"index": 3, "text": "b"}]}))
    (event,) = parsed(out)
    assert [c["index"] for c in event["choices"]] == [0, 3]


def test_a_completion_chunk_without_choices_keeps_none() -> None:
    spliced = ContinuationScanner(first_part(), (0, 1), completions=True)
    out = spliced.feed(events({"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
                               "choices": None, "usage": {"prompt_tokens": 3, "completion_tokens": 1}}))
    (event,) = parsed(out)
    assert event["choices"] == [] and event["usage"]["completion_tokens"] == 2


def test_a_completions_stream_continued_on_completions_is_not_made_chat() -> None:
    spliced = ContinuationScanner(first_part("completions"), (0, 1), completions=True)
    assert spliced.endpoint == "completions"
    chunk = {"id": "cmpl-9", "object": "text_completion", "created": 9, "model": "b",
             "choices": [{"index": 0, "text": " two", "finish_reason": None, "delta": {"role": "assistant"}}]}
    (event,) = parsed(spliced.feed(events(chunk)))
    assert event["choices"] == chunk["choices"]  # text kept, and a completions stream has no role to drop
    assert event["id"] == "cmpl-1" and "".join(spliced.tally.text or ()) == " one two"


# -- the resuming step by step (gateway/upstream/resume.py) ------------------------------------------------------------

URLS = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1", "http://127.0.0.1:11/v1"]
SMALL = tier("small", URLS, model="small-model")
MID = tier("mid", URLS[:2], model="mid-model")
BIG = tier("big", URLS[:1], model="big-model")
_EMBED = tier("embed", URLS[:1]).model_dump()
_EMBED.update(endpoint="embeddings", dimensions=8)
EMBED = Tier.model_validate(_EMBED)
CONFIG = gateway_config([SMALL, EMBED, MID, BIG])
TIERS = {t.name: t for t in CONFIG.routes.tiers}
CHAT: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}


class Outcome:
    def __init__(self) -> None:
        self.n = 0

    def inc(self) -> None:
        self.n += 1


class Lease:
    """A lease: what it was released with, exactly as called."""

    def __init__(self, replica: Any) -> None:
        self.replica = replica
        self.releases: list[dict[str, Any]] = []

    def release(self, **kw: Any) -> None:
        self.releases.append(kw)


class Pool:
    """Ranks a tier's replicas in their order; records each call."""

    def __init__(self) -> None:
        self.ranked: list[tuple[str, int, Any]] = []

    def rank(self, t: Tier, tokens: int, balancing: Any) -> list[Any]:
        self.ranked.append((t.name, tokens, balancing))
        return list(t.replicas)


class Counter:
    def __init__(self, n: int) -> None:
        self.n = n

    def count(self, text: str) -> int:
        return self.n


def fired(outcomes: dict[str, Outcome]) -> dict[str, int]:
    return {o: c.n for o, c in outcomes.items() if c.n}


class World:
    """The resumer's surroundings: the app, the fake attempts (which fail for the replicas in `failing`), the
    retry budget (refuses once `budget` tries were taken), the templates served."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, counted: int = 0, failing: tuple[str, ...] = (),
                 budget: int = 99, templates: dict[str, str | None] | None = None) -> None:
        self.outcomes = {o: Outcome() for o in OUTCOMES}
        self.pool = Pool()
        self.metrics = object()
        self.client = object()
        self.count_tokens = lambda ctx: None
        self.attempts: list[dict[str, Any]] = []
        self.posts: list[tuple[str, Any, str, dict[str, Any]]] = []
        self.budget_calls: list[tuple[Any, ...]] = []
        self.template_calls: list[tuple[Any, ...]] = []
        self.templates = templates or {}
        self.specs: list[Any] = []

        def for_spec(spec: Any) -> Counter:
            self.specs.append(spec)
            return Counter(counted)

        async def template(replica: Any, body: Any, settings: Any) -> str | None:
            self.template_calls.append((replica.name, body, settings))
            return self.templates.get(replica.name)

        self.app = SimpleNamespace(outcomes=self.outcomes, pool=self.pool, metrics=self.metrics, client=self.client,
                                   count_tokens=self.count_tokens, counters=SimpleNamespace(for_spec=for_spec),
                                   template=template)
        world = self

        class Attempt:
            def __init__(self, ctx: Any, pool: Any, replica: Any, **kw: Any) -> None:
                world.attempts.append({"ctx": ctx, "pool": pool, "replica": replica.name, **kw})
                self.replica = replica
                self.lease = Lease(replica)
                self.response = object()
                self.exited: list[Any] = []

            def __enter__(self) -> Attempt:
                return self

            def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
                self.exited.append(kind)

            async def post(self, client: Any, path: str, body: bytes) -> Any:
                world.posts.append((self.replica.name, client, path, orjson.loads(body)))
                if self.replica.name in failing:
                    raise Retry(UpstreamError(f"backend {self.replica.name} refused"))
                return self.response

            async def first_bytes(self) -> bytes:
                return b"data: first-" + str(self.replica.name).encode()

            def hand_over(self) -> tuple[Any, Lease]:
                return self.response, self.lease

        def may_try(ctx: Any, pool: Any, metrics: Any, replica: Any) -> bool:
            self.budget_calls.append((ctx, pool, metrics, replica.name))
            return len(self.budget_calls) <= budget

        monkeypatch.setattr(resume_module, "Attempt", Attempt)
        monkeypatch.setattr(resume_module, "may_try", may_try)


def context(body: dict[str, Any] | None = None, *, tier_name: str = "small", held: str = "small-0",
            max_tokens: int | None = 20, prompt_est: int = 100, tenant: bool = True, endpoint: Any = "chat") -> Any:
    ctx = request_context(CONFIG, body or CHAT, endpoint=endpoint)
    asyncio.run(ParseStage()(ctx))
    ctx.route.tier = TIERS[tier_name]
    ctx.upstream.replica = next(r for r in ctx.route.tier.replicas if r.name == held)
    ctx.max_tokens = max_tokens
    ctx.prompt_tokens_est = prompt_est
    ctx.tenant = next(iter(CONFIG.tenants_by_key_hash.values())) if tenant else None
    ctx.cache_key = "a-key"
    return ctx


def broken(*texts: str, finish: str | None = None, keep_text: bool = True) -> SseScanner:
    """A chat stream that broke after `texts` (one content chunk each)."""
    scanner = SseScanner("chat", forward_usage=True, collect_text=keep_text)
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "a"}
    for i, text in enumerate(texts):
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
        if finish is not None and i == len(texts) - 1:
            choice["finish_reason"] = finish
        scanner.feed(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
    return scanner


def run(resumer: StreamResumer, scanner: SseScanner, code: str = "upstream_reset") -> Any:
    return asyncio.run(resumer.resume(scanner, code))


def resumer_of(world: World, ctx: Any, attempts: int = 2) -> tuple[StreamResumer, Lease]:
    held = Lease(ctx.upstream.replica)
    return StreamResumer(world.app, ctx, held, attempts), held  # type: ignore[arg-type]


# -- StreamResumer.resume: before any attempt ------------------------------------------------------------------------

def test_an_answer_whose_finish_was_sent_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that broke after its finish reason (one choice) is whole: the lease is released as failed with
    the chunks sent, counted 'whole', nothing tried, None returned."""
    world = World(monkeypatch, counted=50)
    ctx = context()
    r, held = resumer_of(world, ctx)
    assert run(r, broken(" a", " b", finish="stop")) is None
    assert held.releases == [{"failed": True, "completion": 2}]
    assert fired(world.outcomes) == {"whole": 1}
    assert world.attempts == [] and world.pool.ranked == [] and world.specs == []


def test_a_finished_choice_of_several_is_not_the_whole_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With n > 1 a finish reason is one choice's: not whole, refused (n > 1) with the chunks sent."""
    world = World(monkeypatch, counted=50)
    ctx = context({**CHAT, "n": 2})
    r, held = resumer_of(world, ctx)
    assert run(r, broken(" a", finish="stop")) == "n > 1"
    assert held.releases == [{"failed": True, "completion": 1}]
    assert fired(world.outcomes) == {"refused": 1}


def test_one_answer_of_several_written_is_whole_once_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """best_of 3, n 1: the backend writes three but the client gets one; its finish reason makes it whole."""
    world = World(monkeypatch, counted=50)
    ctx = context({"model": "auto", "prompt": "Once", "stream": True, "best_of": 3}, endpoint="completions")
    assert ctx.reading.outputs == 1 and ctx.reading.generated == 3
    r, held = resumer_of(world, ctx)
    scanner = SseScanner("completions", forward_usage=True, collect_text=True)
    scanner.feed(b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "created": 1, "model": "a",
                                           "choices": [{"index": 0, "text": " upon", "finish_reason": "stop"}]})
                 + b"\n\n")
    assert asyncio.run(r.resume(scanner, "upstream_reset")) is None
    assert held.releases == [{"failed": True, "completion": 1}]
    assert fired(world.outcomes) == {"whole": 1}


def test_a_refused_stream_releases_with_the_chunks_sent_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """The text was not kept: refused, the lease released as failed with the content chunks (the tokenizer is not
    asked), counted 'refused', logged, the words returned, nothing tried."""
    world = World(monkeypatch, counted=50)
    ctx = context()
    r, held = resumer_of(world, ctx)
    with capture_logs() as logs:
        assert run(r, broken(" a", " b", " c", keep_text=False)) == "the text sent was not kept"
    assert held.releases == [{"failed": True, "completion": 3}]
    assert fired(world.outcomes) == {"refused": 1}
    assert world.specs == [] and world.attempts == [] and world.budget_calls == []
    assert [e["event"] for e in logs] == ["stream_not_resumed"]


def test_the_lease_is_released_with_the_tokens_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumable stream's lease is released as failed with the tokens the client has (the tokenizer's count,
    more than the chunks), before anything else is tried."""
    world = World(monkeypatch, counted=7)
    ctx = context()
    r, held = resumer_of(world, ctx)
    run(r, broken(" a", " b"))
    assert held.releases == [{"failed": True, "completion": 7}]
    assert world.specs == [SMALL.tokenizer]


@pytest.mark.parametrize(("max_tokens", "counted"), [(7, 7), (5, 7)])
def test_an_answer_that_used_all_its_tokens_is_whole(monkeypatch: pytest.MonkeyPatch, max_tokens: int,
                                                     counted: int) -> None:
    """All of max_tokens sent (or more): only the end was lost. 'whole', None, nothing tried."""
    world = World(monkeypatch, counted=counted)
    ctx = context(max_tokens=max_tokens)
    r, held = resumer_of(world, ctx)
    assert run(r, broken(" a")) is None
    assert held.releases == [{"failed": True, "completion": counted}]
    assert fired(world.outcomes) == {"whole": 1}
    assert world.attempts == [] and world.pool.ranked == []


# -- StreamResumer.resume: the continuation ---------------------------------------------------------------------------

def test_a_chat_continues_on_the_next_replica_with_exact_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """One token left: the next replica of the tier is ranked with the prompt plus the tokens sent, its try
    counted against the budget, its attempt a continuation (not first) of that length on the tier, the template
    asked for a chat with the request's body and upstream settings, the body posted to the chat path (no
    template) with the text sent, max_tokens lowered and the replica's model, no cache_salt."""
    world = World(monkeypatch, counted=19)
    ctx = context(max_tokens=20, prompt_est=100)
    r, held = resumer_of(world, ctx)
    got = run(r, broken(" a", " b"), code="upstream_eof")
    balancing = ctx.config.routes.balancing
    assert world.pool.ranked == [("small", 119, balancing), ("mid", 119, balancing), ("big", 119, balancing)]
    assert world.budget_calls == [(ctx, world.pool, world.metrics, "small-1")]
    assert world.attempts == [{"ctx": ctx, "pool": world.pool, "replica": "small-1", "tier": SMALL, "tokens": 119,
                               "first": False}]
    assert world.template_calls == [("small-1", ctx.body, ctx.config.routes.upstream)]
    assert world.posts == [("small-1", world.client, "/chat/completions", {
        "model": "small-model", "messages": [*CHAT["messages"], {"role": "assistant", "content": " a b"}],
        "stream": True, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 1})]
    assert got.first == b"data: first-small-1"
    assert fired(world.outcomes) == {"resumed": 1}


def test_the_continuation_asks_for_fewer_min_tokens_by_those_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tokens sent go into the body: vLLM's min_tokens lowered by them (10 - 4), max_tokens too."""
    world = World(monkeypatch, counted=4)
    ctx = context({**CHAT, "min_tokens": 10}, max_tokens=20)
    r, _ = resumer_of(world, ctx)
    run(r, broken(" a"))
    assert world.posts[0][3]["min_tokens"] == 6 and world.posts[0][3]["max_tokens"] == 16


def test_a_chat_with_a_template_continues_on_completions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica with /apply-template: the chat is posted to /completions as its rendered prompt plus the text;
    the splice makes its chunks chat ones."""
    world = World(monkeypatch, counted=2, templates={"small-1": "<t>"})
    ctx = context(max_tokens=None)
    r, _ = resumer_of(world, ctx)
    got = run(r, broken(" a", " b"))
    assert world.posts == [("small-1", world.client, "/completions",
                            {"model": "small-model", "stream": True, "prompt": "<t> a b"})]
    assert got.scanner._as_chat is True


def test_a_completions_stream_asks_no_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """/completions: no template asked, posted to /completions, the splice not made chat."""
    world = World(monkeypatch, counted=1, templates={"small-1": "<t>"})
    ctx = request_context(CONFIG, {"model": "auto", "prompt": "Once", "stream": True}, endpoint="completions")
    asyncio.run(ParseStage()(ctx))
    ctx.route.tier = SMALL
    ctx.upstream.replica = SMALL.replicas[0]
    ctx.max_tokens = 9
    scanner = SseScanner("completions", forward_usage=True, collect_text=True)
    scanner.feed(b"data: " + orjson.dumps({"id": "c", "object": "text_completion", "created": 1, "model": "a",
                                           "choices": [{"index": 0, "text": " upon"}]}) + b"\n\n")
    r, _ = resumer_of(world, ctx)
    got: Any = asyncio.run(r.resume(scanner, "upstream_reset"))
    assert world.template_calls == []
    assert world.posts == [("small-1", world.client, "/completions",
                            {"model": "small-model", "prompt": "Once upon", "stream": True, "max_tokens": 8})]
    assert got.scanner._as_chat is False


def test_a_salted_replica_gets_the_tenants_cache_salt(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica with prefix_cache_salt: the continuation carries the tenant's cache_salt."""
    world = World(monkeypatch, counted=1)
    ctx = context()
    salted = ctx.route.tier.model_copy(update={"replicas": [ctx.route.tier.replicas[0], ctx.route.tier.replicas[1]
                                                            .model_copy(update={"prefix_cache_salt": True})]})
    monkeypatch.setattr(world.pool, "rank", lambda t, tokens, balancing: list(salted.replicas))
    r, _ = resumer_of(world, ctx)
    run(r, broken(" a"))
    assert world.posts[0][3]["cache_salt"] == cache_salt(ctx.tenant)
    assert cache_salt(ctx.tenant) != cache_salt(None)


def test_a_failed_attempt_is_logged_and_the_next_replica_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica that fails the continuation (Retry): `resume_attempt_failed` with the request, the replica and
    the error's words; the next replica is tried and answers."""
    world = World(monkeypatch, counted=1, failing=("small-1",))
    ctx = context()
    r, _ = resumer_of(world, ctx, attempts=2)
    with capture_logs() as logs:
        got = run(r, broken(" a"))
    assert [a["replica"] for a in world.attempts] == ["small-1", "small-2"]
    assert logs[0] == {"event": "resume_attempt_failed", "log_level": "warning", "request_id": ctx.request_id,
                       "backend": "small-1", "reason": "backend small-1 refused"}
    assert got.first == b"data: first-small-2"


def test_the_attempts_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_attempts 2 and two failing replicas: the third is not tried, 'limit', the words returned."""
    world = World(monkeypatch, counted=1, failing=("small-1", "small-2"))
    ctx = context()
    r, _ = resumer_of(world, ctx, attempts=2)
    assert run(r, broken(" a")) == "its attempts are used up"
    assert [a["replica"] for a in world.attempts] == ["small-1", "small-2"]
    assert fired(world.outcomes) == {"limit": 1}


def test_one_attempt_allows_one_try(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_attempts 1: after one failed try, 'limit'."""
    world = World(monkeypatch, counted=1, failing=("small-1",))
    r, _ = resumer_of(world, context(), attempts=1)
    assert run(r, broken(" a")) == "its attempts are used up"
    assert [a["replica"] for a in world.attempts] == ["small-1"]


def test_no_attempts_left_tries_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts used up before the first candidate: 'limit' and no try, not even the budget's."""
    world = World(monkeypatch, counted=1)
    r, _ = resumer_of(world, context(), attempts=0)
    assert run(r, broken(" a")) == "its attempts are used up"
    assert world.attempts == [] and world.budget_calls == []


def test_the_retry_budget_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget refuses the second try: 'budget', its words, no attempt made for it."""
    world = World(monkeypatch, counted=1, failing=("small-1",), budget=1)
    ctx = context()
    r, _ = resumer_of(world, ctx, attempts=5)
    assert run(r, broken(" a")) == "the retry budget is exhausted"
    assert [a["replica"] for a in world.attempts] == ["small-1"]
    assert fired(world.outcomes) == {"budget": 1}


def test_no_other_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every candidate failed (attempts to spare): 'no_replica' and its words."""
    world = World(monkeypatch, counted=1, failing=("big-0",))
    ctx = context(tier_name="big", held="big-0")
    r, _ = resumer_of(world, ctx, attempts=5)
    assert run(r, broken(" a")) == "no other replica could take it"
    assert fired(world.outcomes) == {"no_replica": 1}
    assert world.attempts == []  # the held replica is not a candidate; big is the last tier


def test_a_second_break_skips_every_replica_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same resumer after a second break: the first part's replica, the one that failed and the one that
    answered are all skipped; the attempts count down across breaks."""
    world = World(monkeypatch, counted=1, failing=("small-1",))
    ctx = context(max_tokens=None)
    r, _ = resumer_of(world, ctx, attempts=3)
    run(r, broken(" a"))
    got = run(r, broken(" b"))
    assert [a["replica"] for a in world.attempts] == ["small-1", "small-2", "mid-0"]
    assert got.first == b"data: first-mid-0"
    world2 = World(monkeypatch, counted=1, failing=("small-1",))
    r2, _ = resumer_of(world2, context(max_tokens=None), attempts=2)
    run(r2, broken(" a"))
    assert run(r2, broken(" b")) == "its attempts are used up"


# -- _switch ------------------------------------------------------------------------------------------------------

def test_the_switch_records_the_parts_logs_and_hands_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first part recorded (its replica and tier, 0 before it), then this one (its replica, tier, the tokens
    sent); the context's replica is the new one, its cache key gone; `stream_resumed` logged with every field;
    the continuation holds the new response, first bytes, a splice of the scanner with the counts before each
    part, and a sink on the new lease."""
    world = World(monkeypatch, counted=3, failing=("small-1", "small-2"))
    ctx = context(max_tokens=None)
    r, held = resumer_of(world, ctx, attempts=4)
    scanner = broken(" a")
    with capture_logs() as logs:
        got: Any = run(r, scanner, code="upstream_idle")
    mid0 = MID.replicas[0]
    assert ctx.upstream.resumed_parts == [ResumePart("small-0", SMALL, 0), ResumePart("mid-0", MID, 3)]
    assert ctx.upstream.replica == mid0 and ctx.cache_key is None
    assert logs[-1] == {"event": "stream_resumed", "log_level": "info", "request_id": ctx.request_id,
                        "backend": "mid-0", "tier": "mid", "reason": "upstream_idle", "sent": 3, "part": 2}
    assert isinstance(got.scanner, ContinuationScanner) and got.scanner.tally is scanner.tally
    assert got.scanner._sent == (0, 3) and got.scanner._as_chat is False
    assert isinstance(got.sink, ResumedSink)
    sink: Any = got.sink
    assert sink._sent == (0, 3) and sink._ctx is ctx
    assert sink._count_tokens is world.count_tokens
    lease: Any = sink._lease
    assert lease is not held and lease.replica == mid0
    assert id(r._held) == id(lease)
    assert fired(world.outcomes) == {"resumed": 1}
    # a second break: the first part is not recorded again; the new one's lease is what is released
    with capture_logs() as logs:
        again = run(r, broken(" b"), code="upstream_reset")
    assert ctx.upstream.resumed_parts[:2] == [ResumePart("small-0", SMALL, 0), ResumePart("mid-0", MID, 3)]
    assert len(ctx.upstream.resumed_parts) == 3 and logs[-1]["part"] == 3
    assert again.scanner._sent == (0, 3, 3)
    assert lease.releases == [{"failed": True, "completion": 3}]


# -- _candidates ----------------------------------------------------------------------------------------------------

def test_the_candidates_are_the_tiers_others_then_later_tiers_of_its_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """small's other replicas in rank order, then mid's and big's (later, chat); never the embeddings tier; the
    tried ones left out; each tier ranked with the tokens given."""
    world = World(monkeypatch)
    ctx = context()
    r, _ = resumer_of(world, ctx)
    r._tried.add("small-1")
    got = [(rep.name, t.name) for rep, t in r._candidates(SMALL, 42)]
    assert got == [("small-0", "small"), ("small-2", "small"), ("mid-0", "mid"), ("mid-1", "mid"), ("big-0", "big")]
    balancing = ctx.config.routes.balancing
    assert world.pool.ranked == [("small", 42, balancing), ("mid", 42, balancing), ("big", 42, balancing)]
    assert [(rep.name, t.name) for rep, t in r._candidates(MID, 1)] == [("mid-0", "mid"), ("mid-1", "mid"),
                                                                        ("big-0", "big")]


def test_the_candidates_keep_to_the_tiers_the_tenant_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant allowed small and big only: mid is skipped; without a tenant every later tier is a candidate."""
    world = World(monkeypatch)
    ctx = context()
    ctx.tenant = dataclasses.replace(ctx.tenant, allowed_tiers=frozenset({"small", "big"}))
    r, _ = resumer_of(world, ctx)
    assert [t.name for _, t in r._candidates(SMALL, 1)] == ["small"] * 3 + ["big"]
    none = context(tenant=False)
    r2, _ = resumer_of(world, none)
    assert [t.name for _, t in r2._candidates(SMALL, 1)] == ["small"] * 3 + ["mid"] * 2 + ["big"]


def test_a_tier_not_in_the_routes_has_no_later_tiers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier the routes do not list (a config reloaded since): its own replicas only."""
    world = World(monkeypatch)
    r, _ = resumer_of(world, context())
    gone = SMALL.model_copy(update={"name": "gone"})
    assert [(rep.name, t.name) for rep, t in r._candidates(gone, 1)] == [
        ("small-0", "gone"), ("small-1", "gone"), ("small-2", "gone")]


# -- StreamResumes: for_request, the counter, template ------------------------------------------------------------

def app() -> StreamResumes:
    return StreamResumes(object(), object(), GatewayMetrics(), lambda ctx: None, object())  # type: ignore[arg-type]


def test_the_outcome_counter() -> None:
    """`gateway_stream_resumes_total{outcome}`: one child per outcome, counting in the app's registry; no replica
    known as a chat server yet."""
    a = app()
    assert set(a.outcomes) == set(OUTCOMES)
    a.outcomes["limit"].inc()
    exposed = a.metrics.render().decode()
    assert 'gateway_stream_resumes_total{outcome="limit"} 1.0' in exposed
    assert "# HELP gateway_stream_resumes_total Streams that broke after their first byte, by what the gateway " \
           "did: resumed elsewhere, or why not" in exposed
    assert a._chat_servers == set()


def test_for_request_follows_the_tenants_rule() -> None:
    """Resume off: no resumer; a rule's max_attempts; no rule (or no tenant): 2 attempts, the lease held."""
    a = app()
    ctx = context()
    held: Any = Lease(SMALL.replicas[0])
    ctx.tenant = dataclasses.replace(ctx.tenant, resume=Resume(enabled=False))
    assert a.for_request(ctx, held) is None
    ctx.tenant = dataclasses.replace(ctx.tenant, resume=Resume(max_attempts=5))
    r = a.for_request(ctx, held)
    assert r is not None and r._left == 5 and r._held is held and r._ctx is ctx and r._app is a
    ctx.tenant = dataclasses.replace(ctx.tenant, resume=None)
    assert a.for_request(ctx, held)._left == 2  # type: ignore[union-attr]
    ctx.tenant = None
    assert a.for_request(ctx, held)._left == 2  # type: ignore[union-attr]


class Answer:
    pass


def template_world(monkeypatch: pytest.MonkeyPatch, answer: Any) -> list[tuple[Any, ...]]:
    posts: list[tuple[Any, ...]] = []

    async def post(client: Any, replica: Any, path: str, body: bytes, settings: Any) -> Answer:
        posts.append((client, replica.url, replica.name, path, orjson.loads(body), settings))
        if isinstance(answer, Exception):
            raise answer
        return Answer()

    async def read_answer(response: Any, replica: Any) -> bytes:
        assert isinstance(response, Answer)
        return bytes(answer)

    monkeypatch.setattr(resume_module, "post", post)
    monkeypatch.setattr(resume_module, "read_answer", read_answer)
    return posts


def test_the_template_is_asked_of_the_servers_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /apply-template at the replica's URL without /v1, with the chat's messages only and the upstream
    settings; its prompt returned, and asked again next time."""
    posts = template_world(monkeypatch, orjson.dumps({"prompt": "<s>user: hi\nassistant:"}))
    a = app()
    replica, settings = SMALL.replicas[1], CONFIG.routes.upstream
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert asyncio.run(a.template(replica, body, settings)) == "<s>user: hi\nassistant:"
    assert posts == [(a.client, "http://127.0.0.1:10", "small-1", "/apply-template",
                      {"messages": [{"role": "user", "content": "hi"}]}, settings)]
    assert asyncio.run(a.template(replica, body, settings)) == "<s>user: hi\nassistant:"
    assert len(posts) == 2 and a._chat_servers == set()


@pytest.mark.parametrize("answer", [
    orjson.dumps({"prompt": 3}), orjson.dumps({"other": "x"}), b"not json", orjson.dumps(["a list"]),
    UpstreamStatus(404, "no such endpoint"),
])
def test_a_server_without_the_template_is_remembered(monkeypatch: pytest.MonkeyPatch, answer: Any) -> None:
    """No prompt string (a 404, no JSON, a list, another field): None, and that replica is never asked again;
    another replica still is."""
    posts = template_world(monkeypatch, answer)
    a = app()
    settings = CONFIG.routes.upstream
    assert asyncio.run(a.template(SMALL.replicas[0], {"messages": []}, settings)) is None
    assert a._chat_servers == {"small-0"}
    assert asyncio.run(a.template(SMALL.replicas[0], {"messages": []}, settings)) is None
    assert len(posts) == 1
    asyncio.run(a.template(SMALL.replicas[1], {"messages": []}, settings))
    assert len(posts) == 2


def test_a_template_answer_that_stalls_is_the_replicas_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """/apply-template's answer stalls: `Retry` naming the replica (its words from the answer's reading), not a
    server without templates (nothing remembered)."""

    class Stalled:
        async def read(self) -> bytes:
            raise TimeoutError

    async def post(client: Any, replica: Any, path: str, body: bytes, settings: Any) -> Stalled:
        return Stalled()

    monkeypatch.setattr(resume_module, "post", post)
    a = app()
    with pytest.raises(Retry) as err:
        asyncio.run(a.template(SMALL.replicas[1], {"messages": []}, CONFIG.routes.upstream))
    assert err.value.error.message == "backend small-1 did not answer in time"
    assert a._chat_servers == set()
