"""An OpenAI-compatible embedding server (vLLM `--task embed`, TEI, llama.cpp `--embedding`): texts in, vectors out.

    answer = await embed(client, replica, ["first text", "second"], 1024, settings.upstream)

One POST of all the texts to `replica.url + "/embeddings"` under the replica's model name, floats asked
for (the default everywhere; base64 for the client is encoded by the gateway). An answer that is not
one vector of `dimensions` per text (a malformed body, a per-token answer from a server without
pooling, another model's size) is the replica's fault: `Retry`, like a 5xx.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import orjson

from gateway.backends.h1 import UpstreamClient
from gateway.backends.upstream import Retry, post, read_answer
from gateway.config import Replica
from gateway.config.routes import Upstream
from gateway.errors import UpstreamError


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: npt.NDArray[np.float32]  # (texts, dimensions), in the order of the texts
    prompt_tokens: int | None  # the backend's usage; None when it reported none


async def embed(client: UpstreamClient, replica: Replica, texts: Sequence[str], dimensions: int,
                settings: Upstream, headers: Mapping[str, str] | None = None) -> Embedded:
    """The replica's vectors of `texts`; raises `Retry` or the final error as `upstream.post` does."""
    body = orjson.dumps({"model": replica.model, "input": list(texts)})
    response = await post(client, replica, "/embeddings", body, settings, headers)
    try:
        raw = await read_answer(response, replica)
    finally:
        response.release()  # read whole: back to the pool; cut short (the client left): closed
    return parse_answer(raw, replica, len(texts), dimensions)


def parse_answer(raw: bytes, replica: Replica, count: int, dimensions: int) -> Embedded:
    """`count` vectors of `dimensions` from an OpenAI embeddings list (sorted by `index`), and its usage."""
    try:
        answer = orjson.loads(raw)
        items = sorted(answer["data"], key=lambda item: item["index"])
        indices = [item["index"] for item in items]
        vectors = np.array([item["embedding"] for item in items], dtype=np.float32)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise Retry(UpstreamError(f"backend {replica.name} sent a malformed embeddings answer")) from None
    if vectors.shape != (count, dimensions) or indices != list(range(count)):
        raise Retry(UpstreamError(
            f"backend {replica.name} answered {count} inputs with vectors of shape {vectors.shape}; the tier "
            f"declares {dimensions} dimensions (one pooled vector per input)"))
    usage = answer.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Embedded(vectors, tokens if type(tokens) is int and tokens >= 0 else None)
