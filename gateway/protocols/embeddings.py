"""POST /v1/embeddings (OpenAI): the body's checks and the response's shape.

`input` is a string or an array of 1 to 2048 non-empty strings (token arrays are refused: the
encoder has its own vocabulary); `encoding_format` float or base64; `dimensions` only the
encoder's own. Vectors are float16-rounded whether encoded now or read from the Redis embedding
cache (which stores float16), so the same input always gets the same vector.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gateway.errors import InvalidRequest

MAX_INPUTS = 2048
DIMENSIONS = 384
FORMATS = ("float", "base64")


def check_body(body: dict[str, Any]) -> None:
    """400 naming the field unless the body is an embeddings request this gateway serves."""
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_INPUTS:
        raise InvalidRequest(f"'input' is required: a string or an array of 1 to {MAX_INPUTS} strings", param="input")
    for i, text in enumerate(inputs):
        if not isinstance(text, str) or not text:
            raise InvalidRequest(f"'input[{i}]' must be a non-empty string (token arrays are not supported)",
                                 param=f"input[{i}]")
    if body.get("encoding_format", "float") not in FORMATS:
        raise InvalidRequest(f"'encoding_format' must be one of {', '.join(FORMATS)}", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != DIMENSIONS:
        raise InvalidRequest(f"'dimensions' must be {DIMENSIONS} (the encoder's own) or left out",
                             param="dimensions", code="unsupported_parameter")


def inputs_of(body: dict[str, Any]) -> list[str]:
    inputs = body["input"]
    return [inputs] if isinstance(inputs, str) else list(inputs)


def render(vectors: Sequence[npt.NDArray[np.float32]], encoding_format: str, model: str, prompt_tokens: int) -> bytes:
    """The OpenAI embeddings list."""
    rounded = np.asarray(vectors, dtype=np.float16).astype(np.float32)
    if encoding_format == "base64":
        values: list[Any] = [base64.b64encode(row.tobytes()).decode() for row in rounded]
    else:
        values = rounded.tolist()
    data = [{"object": "embedding", "index": i, "embedding": value} for i, value in enumerate(values)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
