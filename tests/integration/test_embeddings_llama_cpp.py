"""Issue 19 on the real path: a remote embedding tier whose replica is a real llama.cpp embedding server
(`llama-server --embedding --pooling mean`, Gemma 3 270M Q4_K_M mean-pooled: 640 dimensions),
behind the gateway and its Redis embedding cache, through the official openai client."""

import asyncio
import base64
from collections.abc import Iterator

import aiohttp
import numpy as np
import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Replica, Tier
from gateway.local.children import launch_command, start_child, stop_children, wait_healthy
from gateway.local.redis_server import free_port
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp
from tests.integration.test_embeddings_remote import stored
from tests.integration.test_stream_endings import request_lines

TEXTS = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Quarterly revenue grew by 12 percent."]
PRICE = 50.0
# Gemma 3's GGUF names no pooling: llama.cpp would answer one vector per token. Mean pooling makes it a
# sentence embedder (the model is not trained as one, but paraphrases still land close: see the test).


@pytest.fixture(scope="module")
def llama_embedder() -> Iterator[Replica]:
    """One llama.cpp embedding server for the module (one thread)."""
    replica = Replica.model_validate({
        "name": "gemma-embed-0", "url": f"http://127.0.0.1:{free_port()}/v1", "model": "gemma-3-270m-embed",
        "launch": {"kind": "llama_cpp", "model": "gemma3-270m-q4_k_m", "n_threads": 1, "n_ctx": 512,
                   "embedding": True, "pooling": "mean"}})
    children = [start_child(replica.name, launch_command(replica), f"{replica.url}/models", None)]
    try:
        asyncio.run(wait_healthy(children, timeout_s=120))
        yield replica
    finally:
        stop_children(children)


async def direct(replica: Replica, texts: list[str]) -> tuple[np.ndarray, int]:
    """The server's own answer, without the gateway."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{replica.url}/embeddings", json={"model": replica.model, "input": texts}) as answer:
            body = await answer.json()
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32), body["usage"]["prompt_tokens"]


async def test_llama_cpp_embeddings_through_the_gateway_then_from_redis(
        llama_embedder: Replica, start_app: StartApp, redis_url: str) -> None:
    gemma = Tier.model_validate({"name": "gemma-embed", "precision": "int4", "context_window": 512,
                                 "endpoint": "embeddings", "dimensions": 640, "replicas": [llama_embedder.model_dump()],
                                 "prices": {"input_per_mtok": PRICE, "output_per_mtok": 0}})
    config = gateway_config([tier("chat", ["http://127.0.0.1:9/v1"]), gemma])
    client = AsyncOpenAI(base_url=f"{await start_app(create_app(config, redis_url=redis_url))}/v1",
                         api_key=TEST_API_KEY, max_retries=0)
    expected, tokens = await direct(llama_embedder, TEXTS)
    with capture_logs() as logs:
        cold = await client.embeddings.create(model="gemma-embed", input=[*TEXTS, TEXTS[0]])
        await stored(redis_url, len(TEXTS))  # written after the answer
        warm = await client.embeddings.create(model="auto", input=[TEXTS[2], *TEXTS[:2]], encoding_format="base64")
    vectors = np.array([d.embedding for d in cold.data], dtype=np.float32)
    assert vectors.shape == (4, 640) and np.array_equal(vectors[:3], expected)  # what llama.cpp said, float32-exact
    assert np.array_equal(vectors[3], vectors[0])  # the repeated input: encoded once, answered twice
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert unit[0] @ unit[1] > unit[0] @ unit[2] + 0.2  # the paraphrase is closer than the revenue sentence
    decoded = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4")  # type: ignore[arg-type]
                        for d in warm.data])
    assert np.array_equal(decoded, expected[[2, 0, 1]])  # from Redis, in the order asked
    assert cold.usage.prompt_tokens == tokens and warm.usage.prompt_tokens == 0  # the backend's own count
    first, last = await request_lines(logs, 2)
    assert (first["cache"], first["usage_source"], first["prompt_tokens"], first["backend"]) == (
        "miss", "backend", tokens, "gemma-embed-0")
    assert first["cost_usd"] == pytest.approx(tokens * PRICE / 1e6) and first["ttft_ms"] > 0
    assert (last["cache"], last["cost_usd"], last["status"]) == ("hit", 0.0, 200)
