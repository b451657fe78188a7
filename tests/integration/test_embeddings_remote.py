"""Issue 19: remote embedding tiers (`endpoint: embeddings`): /v1/embeddings forwarded to OpenAI-compatible
embedding servers, behind the Redis embedding cache, with failover; against a fake embedding server on loopback
that counts the inputs it was sent."""

import base64
import hashlib
from pathlib import Path
from collections import Counter
from typing import Any

import numpy as np
import pytest
import yaml
from aiohttp import web
from openai import APIStatusError, AsyncOpenAI, BadRequestError
from pydantic import ValidationError
from structlog.testing import capture_logs

from gateway.app import create_app
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


def vector(text: str) -> list[float]:
    """The fake model's vector of `text`: float32 values, the same for the same text."""
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed).standard_normal(DIMS).astype(np.float32).tolist()


def vectors(data: list[Any]) -> list[list[float]]:
    """An answer's vectors as float32 (sent as the shortest decimals that read back as the same float32)."""
    return np.array([d.embedding for d in data], dtype=np.float32).tolist()


def fake_embedder() -> web.Application:
    """/{behaviour}/v1/embeddings: `ok` answers (usage: the words of the inputs), `down` 503, `refuse` 400,
    `short` vectors of the wrong length; every request's behaviour, body and Authorization is kept."""
    seen: list[tuple[str, dict[str, Any], str | None]] = []

    async def embeddings(request: web.Request) -> web.Response:
        behaviour, body = request.match_info["behaviour"], await request.json()
        seen.append((behaviour, body, request.headers.get("Authorization")))
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


async def gateway(start_app: StartApp, tiers: list[Tier], redis_url: str | None = None) -> AsyncOpenAI:
    config = gateway_config([tier("chat", ["http://127.0.0.1:9/v1"]), *tiers])  # the chat tier is never used
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
