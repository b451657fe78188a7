"""Issue 37, as a property over generated requests across all five APIs (OpenAI chat and completions, Responses,
Anthropic Messages, embeddings), through a real gateway on loopback in front of the emulator (which answers `n`,
prompt lists, token-id prompts and content parts as vLLM does) and a real Redis:

- two requests whose meanings differ never share a cache entry: a hit is only ever the answer of an earlier
  request that meant the same, by a normalization written here independently of gateway.reading;
- no output exceeds the tenant's cap: every choice's text within the character cap, the answer's tokens within
  outputs x the token cap, and as many choices as prompts x n;
- every request gets exactly one log line, with the status the client saw, priced when the backend worked.

GATEWAY_PROPERTY_EXAMPLES sets the number of generated requests (150 in the suite; 10,000 for the record in
docs/SECURITY.md)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import queue
import threading
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Tier
from gateway.emulator.harness import serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.server import running
from gateway.testing import TEST_API_KEY, gateway_config, tier

EXAMPLES = int(os.environ.get("GATEWAY_PROPERTY_EXAMPLES", "150"))
CAP_TOKENS, CAP_CHARS, DEFAULT_TOKENS, MAX_TOKENS = 8, 30, 6, 12
CAPPED_KEY = "sk-capped-tenant"
# the test tenant caches every answer (a capped answer is never stored, so it has no cap); "capped" has a cap
POLICY = {"max_tokens": {"default": DEFAULT_TOKENS, "maximum": MAX_TOKENS}, "cache": {"mode": "always"},
          "tenants": [{"name": "test-tenant", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()},
                      {"name": "capped", "api_key_sha256": hashlib.sha256(CAPPED_KEY.encode()).hexdigest(),
                       "output_cap": {"tokens": CAP_TOKENS, "chars": CAP_CHARS}, "cache": {"enabled": False}}]}
EMBEDDER = Tier.model_validate({"name": "minilm", "precision": "fp32", "context_window": 256,
                                "prices": {"input_per_mtok": 100.0, "output_per_mtok": 0}, "embedder": {"kind": "minilm"}})
VERSION = {"anthropic-version": "2023-06-01"}
WORDS = st.sampled_from(["alpha", "beta", "gamma"])
TEXT = st.lists(WORDS, min_size=1, max_size=2).map(" ".join)
IMAGE = st.sampled_from(["AAAA", "BBBB"]).map(lambda d: {"type": "image_url",
                                                          "image_url": {"url": "data:image/png;base64," + d}})


@dataclass
class Generated:
    api: str  # chat, completions, responses, messages, embeddings
    body: dict[str, Any]
    meaning: bytes  # what the backend reads, normalized to the chat or completions request it becomes
    outputs: int  # answers expected: prompts x n


def granted(asked: int | None) -> int:
    """The max_tokens the test tenant's policy grants (default, maximum)."""
    return min(asked or DEFAULT_TOKENS, MAX_TOKENS)


def meaning(family: str, inputs: Any, max_tokens: int | None, n: int, **params: Any) -> bytes:
    return orjson.dumps([family, inputs, granted(max_tokens), n, {k: v for k, v in params.items() if v is not None}],
                        option=orjson.OPT_SORT_KEYS)


def one_text(content: Any) -> Any:
    """One text part reads as its text."""
    if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        return content[0]["text"]
    return content


@st.composite
def chat(draw: st.DrawFn) -> Generated:
    """Conversations of up to three turns, or (as often) one user turn from a small set, so that requests
    differing in one input only (an image, a role, n) meet often."""
    content = st.one_of(TEXT, st.lists(st.one_of(TEXT.map(lambda t: {"type": "text", "text": t}), IMAGE),
                                       min_size=1, max_size=2))
    one_turn = st.tuples(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant"]),
        "content": st.one_of(WORDS, st.tuples(WORDS, IMAGE).map(lambda p: [{"type": "text", "text": p[0]}, p[1]]))}))
    messages: list[dict[str, Any]] = list(draw(st.one_of(one_turn, st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["system", "user", "assistant"]), "content": content}), min_size=1, max_size=3))))
    n, max_tokens, seed = draw(st.sampled_from([None, 1, 2])), draw(st.sampled_from([None, 4, 100])), \
        draw(st.sampled_from([None, 1]))
    body = {"model": "t", "messages": messages, "stream": draw(st.booleans()), "temperature": 0,
            **({"n": n} if n else {}), **({"max_tokens": max_tokens} if max_tokens else {}),
            **({"seed": seed} if seed else {})}
    inputs = [{**m, "content": one_text(m["content"])} for m in messages]
    return Generated("chat", body, meaning("chat", inputs, max_tokens, n or 1, temperature=0, seed=seed), n or 1)


@st.composite
def completions(draw: st.DrawFn) -> Generated:
    ids = st.lists(st.integers(1, 3), min_size=1, max_size=3)
    prompt = draw(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3), ids, st.lists(ids, min_size=1, max_size=2)))
    n, max_tokens = draw(st.sampled_from([None, 1, 2])), draw(st.sampled_from([None, 4, 100]))
    body = {"model": "t", "prompt": prompt, "stream": draw(st.booleans()), "temperature": 0,
            **({"n": n} if n else {}), **({"max_tokens": max_tokens} if max_tokens else {})}
    many = isinstance(prompt, list) and not isinstance(prompt[0], int)
    normal = prompt[0] if many and len(prompt) == 1 else prompt
    outputs = (len(prompt) if many else 1) * (n or 1)
    return Generated("completions", body, meaning("completions", normal, max_tokens, n or 1, temperature=0), outputs)


@st.composite
def responses(draw: st.DrawFn) -> Generated:
    text = draw(TEXT)
    instructions, max_tokens = draw(st.sampled_from([None, "be terse"])), draw(st.sampled_from([None, 100]))
    body = {"model": "t", "input": text, "temperature": 0, **({"instructions": instructions} if instructions else {}),
            **({"max_output_tokens": max_tokens} if max_tokens else {})}
    inputs = ([{"role": "system", "content": instructions}] if instructions else []) + [{"role": "user", "content": text}]
    return Generated("responses", body, meaning("chat", inputs, max_tokens, 1, temperature=0), 1)


@st.composite
def messages(draw: st.DrawFn) -> Generated:
    turns = draw(st.lists(TEXT, min_size=1, max_size=2))
    system, max_tokens = draw(st.sampled_from([None, "be terse"])), draw(st.sampled_from([4, 100]))
    chat_turns = [{"role": "user", "content": t} for t in turns]
    body = {"model": "t", "max_tokens": max_tokens, "messages": chat_turns, "temperature": 0,
            **({"system": system} if system else {})}
    inputs = ([{"role": "system", "content": system}] if system else []) + chat_turns
    return Generated("messages", body, meaning("chat", inputs, max_tokens, 1, temperature=0), 1)


@st.composite
def embeddings(draw: st.DrawFn) -> Generated:
    inputs = draw(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=3)))
    count = len(inputs) if isinstance(inputs, list) else 1
    return Generated("embeddings", {"model": "minilm", "input": inputs}, meaning("embeddings", inputs, None, 1), count)


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages", "embeddings": "/v1/embeddings"}


def answers(api: str, raw: bytes, stream: bool) -> dict[int, str]:
    """The text of each choice, by index, from a JSON answer or an SSE stream."""
    if stream:
        texts: dict[int, str] = {}
        for line in raw.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            for choice in orjson.loads(line[6:]).get("choices", ()):
                piece = choice.get("delta", {}).get("content") if api == "chat" else choice.get("text")
                texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
        return texts
    data = orjson.loads(raw)
    if api == "responses":
        return {0: data["output"][0]["content"][0]["text"]}
    if api == "messages":
        return {0: "".join(block["text"] for block in data["content"])}
    if api == "embeddings":
        return {item["index"]: "vector" for item in data["data"]}
    return {c["index"]: (c["message"]["content"] or "") if api == "chat" else c["text"] for c in data["choices"]}


@pytest.fixture
def gateway(redis_url: str) -> Iterator[str]:
    """The emulator and a gateway on their own event loop in a thread: hypothesis drives them synchronously."""
    ready: queue.Queue[str] = queue.Queue()
    loop = asyncio.new_event_loop()
    stop = loop.create_future()

    async def serve() -> None:
        async with serve_emulator(get_profile("instant"), 0, None) as emulator:
            config = gateway_config([tier("t", [f"{emulator.url}/v1"]), EMBEDDER], policy=POLICY)
            async with running(create_app(config, redis_url=redis_url)) as url:
                ready.put(url)
                await stop

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    yield ready.get(timeout=60)
    loop.call_soon_threadsafe(stop.set_result, None)
    thread.join(timeout=30)


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as captured:
        yield captured


def log_lines(logs: list[MutableMapping[str, Any]], request_id: str) -> list[MutableMapping[str, Any]]:
    """The request's log lines, once it has one (accounting runs just after the answer went out)."""
    deadline = time.monotonic() + 5
    while True:
        found = [e for e in list(logs) if e.get("event") == "request" and e.get("request_id") == request_id]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.005)


SEEN: dict[bytes, dict[int, str]] = {}
HITS: dict[str | None, int] = {}  # cache outcomes seen (test_the_property_saw_cache_hits)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=st.one_of(chat(), completions(), responses(), messages(), embeddings()), capped=st.booleans())
def test_generated_requests_keep_every_promise_of_the_reading(gateway: str, logs: list[MutableMapping[str, Any]],
                                                              request: Generated, capped: bool) -> None:
    headers = {"Authorization": f"Bearer {CAPPED_KEY if capped else TEST_API_KEY}", **VERSION}
    response = httpx.post(gateway + PATHS[request.api], json=request.body, headers=headers, timeout=30)
    assert response.status_code == 200, (request.body, response.text[:300])
    texts = answers(request.api, response.content, bool(request.body.get("stream")))
    assert sorted(texts) == list(range(request.outputs)), (request.body, texts)
    assert not capped or all(len(text) <= CAP_CHARS for text in texts.values()), texts
    cache = response.headers.get("x-gateway-cache")
    HITS[cache] = HITS.get(cache, 0) + 1
    key = orjson.dumps([gateway, capped]) + request.meaning  # a new gateway (each test run) has a new Redis database
    if cache == "hit":  # only ever the answer of a request that meant the same
        assert key in SEEN and SEEN[key] == texts, (request.body, texts)
    SEEN.setdefault(key, texts)
    lines = log_lines(logs, response.headers["x-request-id"])
    assert len(lines) == 1 and lines[0]["status"] == 200, lines
    if lines[0]["cache"] not in ("hit", "semantic_hit") and request.api != "embeddings":
        ceiling = CAP_TOKENS if capped else MAX_TOKENS
        assert lines[0]["cost_usd"] > 0 and lines[0]["completion_tokens"] <= ceiling * request.outputs, lines


def test_the_property_saw_cache_hits() -> None:
    """The property above is only as good as its hits: it must have met some (runs after it, in file order)."""
    assert HITS.get("hit", 0) >= 5 or not SEEN, HITS
