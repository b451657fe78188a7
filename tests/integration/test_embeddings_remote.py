"""Issue 19: remote embedding tiers (`endpoint: embeddings`): /v1/embeddings forwarded to OpenAI-compatible
embedding servers, behind the Redis embedding cache, with failover; against a fake embedding server on loopback
that counts the inputs it was sent."""

import asyncio
import base64
import hashlib
import time
from pathlib import Path
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml
from aiohttp import web
from openai import APIStatusError, AsyncOpenAI, BadRequestError
from pydantic import ValidationError
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cache.singleflight import Flight, SingleFlight
from gateway.config import Tier
from gateway.local.redis_server import free_port
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp
from tests.integration.test_embeddings import stored_vectors
from tests.integration.test_stream_endings import request_lines

DIMS = 8
PRICE = 100.0  # USD per million input tokens: large enough to see
REPLICA_KEY = "replica-secret"
Seen = web.AppKey("seen", list[tuple[str, dict[str, Any], str | None]])  # (behaviour, body, Authorization)
Hold = web.AppKey("hold", asyncio.Event)  # `held` requests answer once it is set
Failing = web.AppKey("failing", list[int])  # the statuses of the next `held` requests, as they arrive (0: no answer)


def vector(text: str) -> list[float]:
    """The fake model's vector of `text`: float32 values, the same for the same text."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32).tolist()


def vectors(data: list[Any]) -> list[list[float]]:
    """An answer's vectors as float32 (sent as the shortest decimals that read back as the same float32)."""
    return np.array([d.embedding for d in data], dtype=np.float32).tolist()


def fake_embedder() -> web.Application:
    """/{behaviour}/v1/embeddings: `ok` answers (usage: the words of the inputs), `down` 503, `refuse` 400,
    `short` vectors of the wrong length, `held` as `ok` (or the next of `Failing`) once `Hold` is set; every
    request's behaviour, body and Authorization is kept."""
    seen: list[tuple[str, dict[str, Any], str | None]] = []

    async def embeddings(request: web.Request) -> web.Response:
        behaviour, body = request.match_info["behaviour"], await request.json()
        seen.append((behaviour, body, request.headers.get("Authorization")))
        if behaviour == "held":
            failure = request.app[Failing].pop(0) if request.app[Failing] else None
            await request.app[Hold].wait()
            if failure == 0:
                await asyncio.sleep(3600)  # the gateway gives up first
            if failure:
                return web.json_response({"error": {"message": "held, then failed"}}, status=failure)
        if behaviour == "down":
            return web.json_response({"error": {"message": "model is loading"}}, status=503)
        if behaviour == "refuse":
            return web.json_response({"error": {"message": "input is longer than 512 tokens"}}, status=400)
        size = DIMS - 1 if behaviour == "short" else DIMS
        data = [{"object": "embedding", "index": i, "embedding": vector(text)[:size]}
                for i, text in enumerate(body["input"])]
        data.reverse()  # the order is the index's, not the list's
        words = sum(len(text.split()) for text in body["input"])
        return web.json_response({"object": "list", "data": data, "model": body["model"],
                                  "usage": {"prompt_tokens": words, "total_tokens": words}})

    app = web.Application()
    app.router.add_post("/{behaviour}/v1/embeddings", embeddings)
    app[Seen] = seen
    app[Hold], app[Failing] = asyncio.Event(), []
    return app


def remote_tier(name: str, base: str, behaviours: list[str]) -> Tier:
    """An embedding tier of DIMS dimensions whose replicas (NAME-0, NAME-1, ...) are the fake's `behaviours`
    (a full URL: that server instead)."""
    urls = [b if b.startswith("http") else f"{base}/{b}/v1" for b in behaviours]
    return Tier.model_validate({
        "name": name, "precision": "fp16", "context_window": 512, "endpoint": "embeddings", "dimensions": DIMS,
        "prices": {"input_per_mtok": PRICE, "output_per_mtok": 0},
        "replicas": [{"name": f"{name}-{i}", "url": url, "model": "fake-embed", "api_key_env": "FAKE_EMBED_KEY"}
                     for i, url in enumerate(urls)]})


@pytest.fixture
async def upstream(start_app: StartApp, monkeypatch: pytest.MonkeyPatch) -> tuple[str, web.Application]:
    monkeypatch.setenv("FAKE_EMBED_KEY", REPLICA_KEY)
    app = fake_embedder()
    return await start_app(app), app


async def gateway(start_app: StartApp, tiers: list[Tier], redis_url: str | None = None,
                  upstream: dict[str, Any] | None = None) -> AsyncOpenAI:
    config = gateway_config([tier("chat", ["http://127.0.0.1:9/v1"]), *tiers], upstream=upstream)  # chat: never used
    return AsyncOpenAI(base_url=f"{await start_app(create_app(config, redis_url=redis_url))}/v1",
                       api_key=TEST_API_KEY, max_retries=0)


async def stored(redis_url: str, n: int) -> None:
    """Wait until Redis holds `n` remote tiers' vectors."""
    await stored_vectors(redis_url, n, pattern="emb:v:*")


def sent(app: web.Application) -> Counter[str]:
    return Counter(text for _, body, _ in app[Seen] for text in body["input"])


async def test_a_repeated_input_is_sent_upstream_once_across_requests_and_replicas(
        upstream: tuple[str, web.Application], start_app: StartApp, redis_url: str) -> None:
    base, fake = upstream
    emb = remote_tier("emb", base, ["ok"])
    first, second = await gateway(start_app, [emb], redis_url), await gateway(start_app, [emb], redis_url)
    with capture_logs() as logs:
        cold = await first.embeddings.create(model="emb", input=["a cat", "a dog sat", "a cat"])
        await stored(redis_url, 2)
        partial = await first.embeddings.create(model="auto", input=["a dog sat", "three more words", "a cat"])
        await stored(redis_url, 3)
        warm = await second.embeddings.create(model="emb", input=["three more words", "a cat", "a dog sat"])
    assert sent(fake) == {"a cat": 1, "a dog sat": 1, "three more words": 1}  # each distinct input once, ever
    assert [len(body["input"]) for _, body, _ in fake[Seen]] == [2, 1]  # the missing inputs, in one batch each
    for answer, texts in ((cold, ["a cat", "a dog sat", "a cat"]), (partial, ["a dog sat", "three more words", "a cat"]),
                          (warm, ["three more words", "a cat", "a dog sat"])):
        assert [d.index for d in answer.data] == [0, 1, 2] and answer.model == "emb"
        assert vectors(answer.data) == [vector(t) for t in texts]  # in input order, float32-exact
    assert (cold.usage.prompt_tokens, partial.usage.prompt_tokens, warm.usage.prompt_tokens) == (5, 3, 0)
    lines = await request_lines(logs, 3)
    assert [line["cache"] for line in lines] == ["miss", "miss", "hit"]
    for line, answer in zip(lines, (cold, partial, warm)):  # the log line says what the client was told
        assert (line["status"], line["tier"], line["prompt_tokens"]) == (200, "emb", answer.usage.prompt_tokens)
        assert line["cost_usd"] == pytest.approx(answer.usage.prompt_tokens * PRICE / 1e6)
    assert (lines[0]["usage_source"], lines[2]["usage_source"], lines[2]["cost_usd"]) == ("backend", "cache", 0.0)
    assert lines[0]["backend"] == "emb-0" and lines[2]["backend"] is None  # the hit went nowhere


async def test_the_openai_sdk_float_base64_and_dimensions(upstream: tuple[str, web.Application],
                                                          start_app: StartApp) -> None:
    base, fake = upstream
    client = await gateway(start_app, [remote_tier("emb", base, ["ok"])])  # no Redis: no cache across requests
    texts = ["first text", "second text", "first text", "third"]
    floats = await client.embeddings.create(model="emb", input=texts, dimensions=DIMS)
    raw = await client.embeddings.with_raw_response.create(model="emb", input=texts, encoding_format="base64")
    assert vectors(floats.data) == [vector(t) for t in texts]
    encoded = raw.parse()
    assert [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4").tolist()  # type: ignore[arg-type]
            for d in encoded.data] == [vector(t) for t in texts]
    assert (raw.headers["x-gateway-tier"], raw.headers["x-gateway-backend"]) == ("emb", "emb-0")
    assert floats.usage.prompt_tokens == encoded.usage.prompt_tokens == 5  # "first text" went once per request
    for _, body, authorization in fake[Seen]:  # plain floats asked for; the replica's own key, never the client's
        assert body == {"model": "fake-embed", "input": ["first text", "second text", "third"]}
        assert authorization == f"Bearer {REPLICA_KEY}"
    with pytest.raises(BadRequestError) as other_size:
        await client.embeddings.create(model="emb", input="x", dimensions=4)
    assert other_size.value.body["param"] == "dimensions" and "must be 8" in other_size.value.message  # type: ignore[index]
    with pytest.raises(BadRequestError) as chat_on_embedder:
        await client.chat.completions.create(model="emb", messages=[{"role": "user", "content": "hi"}])
    assert chat_on_embedder.value.body["param"] == "model"  # type: ignore[index]
    assert len(fake[Seen]) == 2  # refused requests never went upstream


async def test_a_failing_replica_is_retried_on_the_next(upstream: tuple[str, web.Application],
                                                        start_app: StartApp, redis_url: str) -> None:
    base, fake = upstream
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: connection refused
    tiers = [remote_tier("flaky", base, ["down", "ok"]), remote_tier("gone", base, [dead, "ok"]),
             remote_tier("refusing", base, ["refuse", "ok"]), remote_tier("broken", base, ["down", "short"])]
    client = await gateway(start_app, tiers, redis_url)
    with capture_logs() as logs:
        answer = await client.embeddings.create(model="flaky", input=["hello there"])
        reconnected = await client.embeddings.create(model="gone", input=["hello again"])  # not cached yet
        with pytest.raises(BadRequestError) as refused:  # the request's fault: no other replica is tried
            await client.embeddings.create(model="refusing", input=["a very long text"])
        with pytest.raises(APIStatusError) as failed:
            await client.embeddings.create(model="broken", input=["anything"])
    assert vectors([*answer.data, *reconnected.data]) == [vector("hello there"), vector("hello again")]
    assert (refused.value.status_code, refused.value.body["code"]) == (400, "upstream_rejected")  # type: ignore[index]
    assert "input is longer than 512 tokens" in refused.value.message
    assert failed.value.status_code == 502 and failed.value.body["type"] == "upstream_error"  # type: ignore[index]
    assert "vectors of shape (1, 7)" in failed.value.message and "declares 8 dimensions" in failed.value.message
    assert [b for b, _, _ in fake[Seen]] == ["down", "ok", "ok", "refuse", "down", "short"]
    lines = await request_lines(logs, 4)
    assert [(line["backend"], line["attempts"], line["status"]) for line in lines] == [
        ("flaky-1", 2, 200), ("gone-1", 2, 200), ("refusing-0", 1, 400), ("broken-1", 2, 502)]
    assert [line["cost_usd"] > 0 for line in lines] == [True, True, False, False]  # failures cost nothing


def test_routes_declare_an_embedding_tier_with_its_dimensions() -> None:
    def check(**fields: Any) -> None:
        Tier.model_validate({"name": "e", "precision": "fp16", "context_window": 512,
                             "prices": {"input_per_mtok": 1, "output_per_mtok": 0},
                             "replicas": [{"name": "e-0", "url": "http://127.0.0.1:1/v1", "model": "m"}], **fields})

    check(endpoint="embeddings", dimensions=1024)
    for fields, reason in (({"endpoint": "embeddings"}, "needs dimensions"),
                           ({"dimensions": 1024}, "dimensions is for embedding tiers"),
                           ({"endpoint": "embeddings", "dimensions": 8, "native": ["responses"]}, "native is for chat")):
        with pytest.raises(ValidationError, match=reason):
            check(**fields)
    example = (Path(__file__).resolve().parents[2] / "routes/production-vllm.yaml").read_text()
    block = example[example.index("  # - name: bge-m3"):]  # the commented-out example: valid once uncommented
    [bge] = yaml.safe_load("\n".join(line.replace("#", "", 1) for line in block.splitlines()))
    assert (Tier.model_validate(bge).endpoint, Tier.model_validate(bge).dimensions) == ("embeddings", 1024)
    minilm = Tier.model_validate({"name": "m", "precision": "fp32", "context_window": 256, "embedder": {"kind": "minilm"},
                                  "prices": {"input_per_mtok": 1, "output_per_mtok": 0}})
    assert (minilm.endpoint, minilm.dimensions) == ("embeddings", 384)


Joins = list[SingleFlight[Any, Any]]


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> Joins:
    """The single flight of each request that reached it (its inputs missing from Redis), in order."""
    calls: Joins = []
    join = SingleFlight.join

    def counted(self: SingleFlight[Any, Any], keys: Sequence[Any],
                fetch: Callable[[list[Any]], Coroutine[Any, Any, Any]], values: Callable[[Any], Any]) -> Flight[Any, Any, Any]:
        calls.append(self)
        return join(self, keys, fetch, values)

    monkeypatch.setattr(SingleFlight, "join", counted)
    return calls


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.01)


def words(texts: Sequence[str]) -> int:
    """What the fake reports as usage for `texts`."""
    return sum(len(text.split()) for text in texts)


async def test_concurrent_requests_send_each_input_upstream_once(
        upstream: tuple[str, web.Application], start_app: StartApp, redis_url: str, joins: Joins) -> None:
    base, fake = upstream
    client = await gateway(start_app, [remote_tier("emb", base, ["held"])], redis_url)
    batches = [["a cat", "a dog sat"], ["a dog sat", "one two three"], ["a cat", "one two three", "a dog sat", "a cat"],
               ["one two three"], ["four words go here", "a cat"], ["a cat"], ["a dog sat", "a cat"]]
    distinct = {"a cat", "a dog sat", "one two three", "four words go here"}
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            calls = [asyncio.create_task(client.embeddings.create(model="emb", input=b)) for b in batches]
            await until(lambda: len(joins) == len(batches))  # each request leads its inputs or waits for them
            fake[Hold].set()  # no call answered before: Redis held none of them
            answers = await asyncio.gather(*calls)
    assert sent(fake) == dict.fromkeys(distinct, 1)  # each distinct input once, whoever asked first
    for answer, texts in zip(answers, batches):
        assert [d.index for d in answer.data] == list(range(len(texts)))
        assert vectors(answer.data) == [vector(t) for t in texts]
    assert sum(answer.usage.prompt_tokens for answer in answers) == words(list(distinct))  # each billed once
    lines = await request_lines(logs, len(batches))
    assert sorted(line["prompt_tokens"] for line in lines) == sorted(a.usage.prompt_tokens for a in answers)
    for line in lines:  # inputs another request sent are like cache hits: no tokens, no backend
        sender = line["cache"] == "miss"
        assert (line["status"], line["backend"], line["usage_source"]) == (
            200, "emb-0" if sender else None, "backend" if sender else "cache")
        assert (line["prompt_tokens"] > 0) == sender
        assert line["cost_usd"] == pytest.approx(line["prompt_tokens"] * PRICE / 1e6)
    assert sum(line["cache"] == "miss" for line in lines) == len(fake[Seen])  # one call per request that sent any
    assert len(joins[0]) == 0 and all(flights is joins[0] for flights in joins)  # one per gateway, empty again
    await stored(redis_url, len(distinct))


@pytest.mark.parametrize(("failure", "status"), [(503, 502), (400, 400), (0, 504)],
                         ids=["upstream_error", "refused", "timeout"])
async def test_when_the_leading_call_fails_each_waiter_sends_its_inputs_itself(
        upstream: tuple[str, web.Application], start_app: StartApp, redis_url: str, joins: Joins,
        failure: int, status: int) -> None:
    base, fake = upstream
    fake[Failing].append(failure)  # the first call only
    client = await gateway(start_app, [remote_tier("emb", base, ["held"])], redis_url, upstream={"read_timeout_s": 1.5})
    batches = [["shared words"], ["waiter own", "shared words"], ["shared words"]]
    with capture_logs() as logs:
        async with asyncio.timeout(10):
            leader = asyncio.create_task(client.embeddings.create(model="emb", input=["shared words", "leader only"]))
            await until(lambda: len(fake[Seen]) == 1)
            waiters = [asyncio.create_task(client.embeddings.create(model="emb", input=b)) for b in batches]
            await until(lambda: len(joins) == 1 + len(batches))
            fake[Hold].set()
            with pytest.raises(APIStatusError) as failed:
                await leader
            answers = await asyncio.gather(*waiters)
    assert failed.value.status_code == status  # the leader's own error, as without single flight
    for answer, texts in zip(answers, batches):
        assert vectors(answer.data) == [vector(t) for t in texts]
    # the failed call, the second waiter's own input, then each waiter's own call of what it waited for (not shared)
    assert sent(fake) == {"shared words": 1 + len(batches), "leader only": 1, "waiter own": 1}
    assert [answer.usage.prompt_tokens for answer in answers] == [2, 4, 2]  # what each sent, in one or two calls
    lines = await request_lines(logs, 1 + len(batches))
    assert sorted((line["status"], line["cache"], line["attempts"], line["prompt_tokens"]) for line in lines) == sorted(
        [(status, "miss", 1, 0), (200, "miss", 1, 2), (200, "miss", 2, 4), (200, "miss", 1, 2)])
    assert [line["cost_usd"] for line in lines if line["status"] == status] == [0.0]  # failures cost nothing
    assert len(joins[0]) == 0


async def test_a_leader_that_disconnects_leaves_its_call_to_the_waiters(
        upstream: tuple[str, web.Application], start_app: StartApp, redis_url: str, joins: Joins) -> None:
    base, fake = upstream
    client = await gateway(start_app, [remote_tier("emb", base, ["held"])], redis_url)
    batches = [["shared words"], ["waiter own", "shared words", "leader only"]]

    async def lead() -> None:
        body = {"model": "emb", "input": ["shared words", "leader only"]}
        async with aiohttp.ClientSession() as session:
            await session.post(f"{client.base_url}embeddings", json=body, headers={"Authorization": f"Bearer {TEST_API_KEY}"})

    with capture_logs() as logs:
        async with asyncio.timeout(10):
            leader = asyncio.create_task(lead())
            await until(lambda: len(fake[Seen]) == 1)
            waiters = [asyncio.create_task(client.embeddings.create(model="emb", input=b)) for b in batches]
            await until(lambda: len(joins) == 1 + len(batches))
            leader.cancel()  # hang up
            [left] = await request_lines(logs, 1)  # the gateway saw it go: its handler was cancelled
            fake[Hold].set()
            answers = await asyncio.gather(*waiters)
    assert (left["status"], left["outcome"]) == (499, "client_disconnected")
    for answer, texts in zip(answers, batches):
        assert vectors(answer.data) == [vector(t) for t in texts]
    assert sent(fake) == {"shared words": 1, "leader only": 1, "waiter own": 1}  # the leader's call went on for them
    assert [answer.usage.prompt_tokens for answer in answers] == [0, 2]
    await stored(redis_url, 3)  # the call that outlived its request wrote its vectors too
    assert len(joins[0]) == 0
