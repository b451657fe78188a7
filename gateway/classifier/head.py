"""The difficulty head at serve time: a tiny ONNX logistic regression on top of the encoder's embedding.

    difficulty = sigmoid(w · ((concat(embedding, log_chars) - mean) / std) + b)

Inputs `embedding` (B, 384) float32 and `log_chars` (B, 1) float32 = log1p(characters of the
prompt); output `difficulty` (B, 1) float32. It is a graph of its own, not part of the encoder:
the embedding is cached and shared with the semantic cache, and `gateway train` refits only this.
`HeadSession` needs only onnxruntime; the graph is fitted and built offline by gateway.training.fit
(the `onnx` package, train extra).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from gateway.classifier.encoder import EMBEDDING_DIM

FEATURES: Final = EMBEDDING_DIM + 1  # embedding, then log_chars
Array = npt.NDArray[np.float32]


def log_chars(texts: Sequence[str]) -> Array:
    """The length feature (len(texts), 1): log1p of each prompt's length in characters."""
    return np.array([[math.log1p(len(t))] for t in texts], dtype=np.float32).reshape(len(texts), 1)


class HeadSession:
    """The head on onnxruntime's CPU provider, one thread: ~tens of microseconds per call."""

    def __init__(self, path: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.path = Path(path)
        self._session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.metadata: dict[str, str] = dict(self._session.get_modelmeta().custom_metadata_map)

    def score(self, embeddings: npt.ArrayLike, log_chars: npt.ArrayLike) -> Array:
        """Difficulty (B,) in [0, 1] for embeddings (B, 384) and log_chars (B,) or (B, 1)."""
        emb = np.ascontiguousarray(embeddings, dtype=np.float32)
        if emb.ndim == 1:
            emb = emb.reshape(1, -1)
        lengths = np.ascontiguousarray(log_chars, dtype=np.float32).reshape(-1, 1)
        if emb.shape[1:] != (EMBEDDING_DIM,) or lengths.shape[0] != emb.shape[0]:
            raise ValueError(f"need embeddings (B, {EMBEDDING_DIM}) and B log_chars, got {emb.shape}, {lengths.shape}")
        (out,) = self._session.run(["difficulty"], {"embedding": emb, "log_chars": lengths})
        return np.asarray(out, dtype=np.float32).reshape(-1)
