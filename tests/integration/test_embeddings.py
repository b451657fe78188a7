"""Issue 19: /v1/embeddings on the in-process MiniLM tier, with the official openai client, behind Redis."""

import asyncio
import base64
import time

import numpy as np
import pytest
from openai import AsyncOpenAI, BadRequestError
from redis.asyncio import Redis
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Tier
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_stream_endings import request_lines

INPUTS = ["The cat sat on the mat.", "A cat was sitting on a rug.", "Quarterly revenue grew by 12 percent."]
EMBEDDER = Tier.model_validate({"name": "minilm", "precision": "fp32", "context_window": 256,
                                "prices": {"input_per_mtok": 100.0, "output_per_mtok": 0}, "embedder": {"kind": "minilm"}})


async def gateway_client(start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> AsyncOpenAI:
    emulator = await start_emulator()
    config = gateway_config([tier("chat", [f"{emulator.url}/v1"]), EMBEDDER])
    return AsyncOpenAI(base_url=f"{await start_app(create_app(config, redis_url=redis_url))}/v1", api_key=TEST_API_KEY)


async def stored_vectors(redis_url: str, n: int, timeout_s: float = 5.0, pattern: str = "emb:*") -> None:
    """Wait until Redis holds `n` vectors under `pattern` (they are written after the answer)."""
    client = Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout_s
    while len(await client.keys(pattern)) < n:
        assert time.monotonic() < deadline, "the vectors never reached Redis"
        await asyncio.sleep(0.01)
    await client.aclose()


async def test_embeddings_several_inputs_then_a_redis_hit_on_another_replica(
        start_emulator: StartEmulator, start_app: StartApp, redis_url: str) -> None:
    first = await gateway_client(start_emulator, start_app, redis_url)
    second = await gateway_client(start_emulator, start_app, redis_url)  # a second gateway replica, same Redis
    with capture_logs() as logs:
        cold = await first.embeddings.create(model="minilm", input=INPUTS)
        await stored_vectors(redis_url, len(INPUTS))  # written behind the answer
        warm = await second.embeddings.create(model="auto", input=INPUTS, encoding_format="base64")
    vectors = np.array([d.embedding for d in cold.data], dtype=np.float32)  # float32 numbers, as OpenAI's
    assert vectors.shape == (3, 384) and [d.index for d in cold.data] == [0, 1, 2]
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3  # real sentence embeddings: paraphrases are close
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype=np.float32)  # type: ignore[arg-type]
               for d in warm.data]
    assert np.array_equal(np.array(decoded), vectors)  # float16 from Redis: the same vectors as encoded
    cold_line, warm_line = await request_lines(logs, 2)
    assert (cold_line["cache"], warm_line["cache"]) == ("miss", "hit")  # the second replica encoded nothing
    assert cold.usage.prompt_tokens == warm.usage.prompt_tokens == cold_line["prompt_tokens"] > 0
    assert cold_line["cost_usd"] == pytest.approx(cold.usage.prompt_tokens * 100.0 / 1e6)
    assert (warm_line["cost_usd"], warm_line["tier"]) == (0.0, "minilm")


async def test_embeddings_bad_input_names_the_field(start_emulator: StartEmulator, start_app: StartApp,
                                                    redis_url: str) -> None:
    client = await gateway_client(start_emulator, start_app, redis_url)
    for kwargs, param in (({"input": ["ok", ""]}, "input[1]"), ({"input": "x", "dimensions": 64}, "dimensions"),
                          ({"input": [[1, 2]]}, "input[0]"), ({"input": "x", "model": "chat"}, "model")):
        with pytest.raises(BadRequestError) as caught:
            await client.embeddings.create(**{"model": "minilm", **kwargs})  # type: ignore[call-overload]
        assert caught.value.body["param"] == param, caught.value.body  # type: ignore[index]
    with pytest.raises(BadRequestError) as chat_on_encoder:
        await client.chat.completions.create(model="minilm", messages=[{"role": "user", "content": "hi"}])
    assert chat_on_encoder.value.body["param"] == "model"  # type: ignore[index]
