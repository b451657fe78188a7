"""POST /v1/embeddings (OpenAI): the body's checks and the response's shape.

`input` is a string or an array of 1 to 2048 non-empty strings (token arrays are refused: tiers
have their own vocabularies); `encoding_format` float or base64 (base64: the float32 bytes, little
endian, as OpenAI sends them); `dimensions` a positive integer, and then only the tier's own
(`check_dimensions`, once the tier is known: no model is asked to shorten its vectors). The
in-process encoder's vectors are float16-rounded whether encoded now or read from the Redis
embedding cache (which stores float16), so the same input always gets the same vector; a remote
tier's vectors go out as the backend sent them (float32, which its cache keeps).
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
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise InvalidRequest("'dimensions' must be a positive integer", param="dimensions")


def check_dimensions(body: dict[str, Any], tier: str, dimensions: int) -> None:
    """400 naming `dimensions` unless the body leaves it out or asks for the tier's own vector length."""
    asked = body.get("dimensions")
    if asked is not None and asked != dimensions:
        raise InvalidRequest(f"'dimensions' must be {dimensions} (the vector length of model {tier!r}) or left out",
                             param="dimensions", code="unsupported_parameter")


def inputs_of(body: dict[str, Any]) -> list[str]:
    inputs = body["input"]
    return [inputs] if isinstance(inputs, str) else list(inputs)


def float16_rounded(vectors: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[np.float32]:
    """The vectors as the float16 embedding cache holds them (the in-process encoder's answer)."""
    return np.asarray(vectors, dtype=np.float16).astype(np.float32)


def render(vectors: Sequence[npt.NDArray[np.float32]] | npt.NDArray[np.float32], encoding_format: str, model: str,
           prompt_tokens: int) -> bytes:
    """The OpenAI embeddings list, the vectors in input order: float32 numbers (each written as the shortest
    decimal that reads back as the same float32, as OpenAI writes them), or base64 of their bytes."""
    rows = np.asarray(vectors, dtype="<f4")
    values: Any = [base64.b64encode(row.tobytes()).decode() for row in rows] if encoding_format == "base64" else rows
    data = [{"object": "embedding", "index": i, "embedding": value} for i, value in enumerate(values)]
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage},
                        option=orjson.OPT_SERIALIZE_NUMPY)
