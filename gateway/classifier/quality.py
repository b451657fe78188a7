"""The serving quality predictor: prompt -> expected score in [0, 1] of each measured model (models/router).

    predictor = load_quality_predictor(Path("models/router"), embedder=classifier.embedder)
    quality = await predictor.predict(prompt)      # {"mistral-7b-instruct-v0.3": 0.41, ...}

It reads the same embedding as the difficulty classifier (the `difficulty` encoder graph and token window
recorded in metrics.json; pass the classifier's CachedEmbedder and a prompt is encoded once for both), plus
cheap surface features of the whole prompt (gateway.classifier.prompt_features), and applies one logistic
output per model, numpy only, then the rubric gate:

    measured[m] = sigmoid(((concat(embedding, features) - mean) / std) @ weights[:, m] + bias[m])
    gate        = h / (h + gate_h0)       h = the difficulty head's P(hard) on the same embedding
    quality[m]  = 1 - gate * (1 - measured[m])

The outcome data are benchmark items, every one a task with a right answer; on a prompt the rubric calls
trivial (a greeting, "reply with OK") every model answers well, and the gate says so: the predicted shortfall
of each model shrinks with P(hard). gate_h0 = 0 turns the gate off.

router.npz holds `models`, `mean`, `std`, `weights` (D, M), `bias` (M,) and `gate_h0`; metrics.json the encoder
it was fitted on (graph, variant, window, SHA-256: a mismatch is refused, as for the difficulty head), the
difficulty head's SHA-256 (the gate reads it), the feature names and the held-out measurements. Fitted offline
by gateway.training.router_train.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.difficulty import EncoderMismatch, encoder_graph, file_sha256, max_tokens_of, namespace_of
from gateway.classifier.embedder import CachedEmbedder, SharedEmbeddings
from gateway.classifier.embedding_cache import EmbeddingCache
from gateway.classifier.encoder import EMBEDDING_DIM, EncoderSession, default_model_path
from gateway.classifier.head import HeadSession, log_chars
from gateway.classifier.prompt_features import NAMES, feature_matrix
from gateway.classifier.tokenize import PromptTokenizer

ARRAYS = "router.npz"
F32 = npt.NDArray[np.float32]
HEAD_FILE = "head.onnx"


def rubric_gate(measured: npt.NDArray[np.floating[Any]], hard: npt.ArrayLike, gate_h0: float) -> F32:
    """quality = 1 - gate * (1 - measured), gate = hard / (hard + gate_h0); (B, M) from (B, M) and (B,)."""
    if gate_h0 <= 0:
        return np.asarray(measured, dtype=np.float32)
    h = np.asarray(hard, dtype=np.float64).reshape(-1, 1)
    out: F32 = (1.0 - h / (h + gate_h0) * (1.0 - measured)).astype(np.float32)
    return out


class QualityHead:
    """The fitted outputs on numpy: (B, 384) embeddings + texts -> (B, M) expected scores."""

    def __init__(self, models: Sequence[str], mean: F32, std: F32, weights: F32, bias: F32, *,
                 gate_h0: float = 0.0, rubric: HeadSession | None = None) -> None:
        width = EMBEDDING_DIM + len(NAMES)
        if mean.shape != (width,) or std.shape != (width,) or weights.shape != (width, len(models)) \
                or bias.shape != (len(models),):
            raise ValueError(f"router arrays do not fit {width} features and {len(models)} models: "
                             f"mean {mean.shape}, std {std.shape}, weights {weights.shape}, bias {bias.shape}")
        if not np.all(std > 0) or not all(np.all(np.isfinite(a)) for a in (mean, weights, bias)):
            raise ValueError("router arrays hold non-finite values or a non-positive std")
        if gate_h0 > 0 and rubric is None:
            raise ValueError(f"the router's rubric gate (gate_h0 {gate_h0}) needs the difficulty head")
        self.models = tuple(models)
        self.gate_h0 = float(gate_h0)
        self.rubric = rubric
        # folded: ((x - mean) / std) @ W + b == x @ (W / std) + (b - (mean / std) @ W)
        self._weights = np.ascontiguousarray(weights / std[:, None], dtype=np.float32)
        self._bias = (bias - (mean / std) @ weights).astype(np.float32)

    @classmethod
    def load(cls, path: Path, rubric: HeadSession | None = None) -> QualityHead:
        with np.load(path, allow_pickle=False) as data:
            gate = float(data["gate_h0"]) if "gate_h0" in data else 0.0
            return cls([str(m) for m in data["models"]], *(data[k].astype(np.float32)
                                                           for k in ("mean", "std", "weights", "bias")),
                       gate_h0=gate, rubric=rubric if gate > 0 else None)

    def measured(self, embeddings: npt.ArrayLike, texts: Sequence[str]) -> F32:
        """The logistic outputs alone (no gate): (B, M)."""
        emb = np.asarray(embeddings, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
        x = np.hstack([emb, feature_matrix(texts)])
        logits = x @ self._weights + self._bias
        out: F32 = (0.5 * (1.0 + np.tanh(0.5 * logits))).astype(np.float32)
        return out

    def scores(self, embeddings: npt.ArrayLike, texts: Sequence[str]) -> F32:
        """Expected score of each model, gated by the rubric: (B, M) in [0, 1]."""
        measured = self.measured(embeddings, texts)
        if self.rubric is None:
            return measured
        emb = np.asarray(embeddings, dtype=np.float32).reshape(len(texts), EMBEDDING_DIM)
        return rubric_gate(measured, self.rubric.score(emb, log_chars(texts)), self.gate_h0)


class QualityPredictor:
    """`await predict(text)` -> {model: expected score in [0, 1]}; `close()` when done (a shared embedder is
    left to its owner)."""

    def __init__(self, head: QualityHead, embedder: CachedEmbedder, *, owns_embedder: bool,
                 metrics: dict[str, Any] | None = None) -> None:
        self.head = head
        self.models: tuple[str, ...] = head.models
        self.embedder = embedder
        self.metrics = metrics or {}
        self._owns_embedder = owns_embedder

    async def predict(self, text: str) -> dict[str, float]:
        (row,) = await self.predict_many([text])
        return row

    async def predict_many(self, texts: Sequence[str]) -> list[dict[str, float]]:
        """One dict per text; the embeddings come through the cache (a repeated text is encoded once)."""
        if not texts:
            return []
        embeddings, _ = await self.embedder.embed_many(texts)
        scores = self.head.scores(np.stack(embeddings), texts)
        return [dict(zip(self.models, map(float, row), strict=True)) for row in scores]

    def close(self) -> None:
        if self._owns_embedder:
            self.embedder.close()


def read_router_metrics(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "metrics.json"
    if not path.is_file() or not (model_dir / ARRAYS).is_file():
        raise FileNotFoundError(f"{model_dir} lacks metrics.json or {ARRAYS}: train it with "
                                "`gateway train --from-outcomes FILE... --out DIR`")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if list(data.get("features", {}).get("names", [])) != list(NAMES):
        raise ValueError(f"{path}: the router was fitted on features {data.get('features')}, this gateway computes "
                         f"{list(NAMES)}: retrain it")
    return data


def open_rubric(metrics: dict[str, Any], model_dir: Path) -> HeadSession | None:
    """The difficulty head the gate reads (metrics.json `gate.head`, relative to the repository's models/),
    refused when its SHA-256 is not the one recorded; None without a gate."""
    gate = metrics.get("gate") or {}
    if not gate.get("h0"):
        return None
    path = (model_dir.parent / str(gate["head_dir"]) / HEAD_FILE).resolve()
    if (actual := file_sha256(path)) != gate["head_sha256"]:
        raise EncoderMismatch(f"{path} has sha256 {actual[:16]}..., the router's gate was set with "
                              f"{str(gate['head_sha256'])[:16]}...: retrain the router after the difficulty head")
    return HeadSession(path)


def load_quality_predictor(
    model_dir: Path, *, embedder: CachedEmbedder | None = None, store: SharedEmbeddings | None = None,
    providers: Sequence[str] | None = None, threads: int = 1, cache_entries: int = 4096,
    window_s: float = 0.002, max_batch: int = 32,
) -> QualityPredictor:
    """A ready predictor for the router in `model_dir` (blocking: call at startup).

    `embedder`: the difficulty classifier's (shared: one encoding per prompt); it must read the encoder file
    and token window the router was fitted on, else EncoderMismatch. Without one, the predictor opens its own."""
    metrics = read_router_metrics(model_dir)
    enc = metrics["encoder"]
    path = default_model_path(str(enc["variant"]), encoder_graph(metrics))
    tokens = max_tokens_of(metrics)
    expected = namespace_of(path, str(enc["sha256"]), tokens)
    head = QualityHead.load(model_dir / ARRAYS, open_rubric(metrics, model_dir))
    if embedder is not None:
        if embedder.namespace != expected:
            raise EncoderMismatch(f"{model_dir} was fitted on embeddings {expected}, the embedder given reads "
                                  f"{embedder.namespace}: retrain the router on the classifier's encoder")
        return QualityPredictor(head, embedder, owns_embedder=False, metrics=metrics)
    if (actual := file_sha256(path)) != enc["sha256"]:
        raise EncoderMismatch(f"{path} has sha256 {actual[:16]}..., {model_dir / 'metrics.json'} records "
                              f"{str(enc['sha256'])[:16]}...: restore that file or retrain the router")
    session = EncoderSession(path, providers=providers, threads=threads, tokenizer=PromptTokenizer(tokens))
    own = CachedEmbedder(MicroBatcher(session, window_s=window_s, max_batch=max_batch), namespace=expected,
                         store=store, cache=EmbeddingCache(cache_entries))
    return QualityPredictor(head, own, owns_embedder=True, metrics=metrics)
