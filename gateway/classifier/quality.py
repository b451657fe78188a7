"""The serving quality predictor: prompt -> expected score in [0, 1] of each measured model (models/router).

    predictor = load_quality_predictor(Path("models/router"), embedder=classifier.embedder)
    quality = await predictor.predict(prompt)      # {"mistral-7b-instruct-v0.3": 0.41, ...}

It reads the same embedding as the difficulty classifier (the `difficulty` encoder graph and token window
recorded in metrics.json; pass the classifier's CachedEmbedder and a prompt is encoded once for both), plus
cheap surface features of the whole prompt, through the router's arithmetic (gateway.classifier.quality_head:
logistic outputs per model, optional kNN blend, rubric gate). metrics.json records the encoder the router was
fitted on (graph, variant, window, SHA-256: a mismatch is refused, as for the difficulty head), the difficulty
head the gate reads (its SHA-256), the feature names and the held-out measurements. Fitted offline by
gateway.training.router_train.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import gateway
from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.difficulty import EncoderMismatch, encoder_graph, file_sha256, max_tokens_of, namespace_of
from gateway.classifier.embedder import OFFLINE_SCOPE, CachedEmbedder, SharedEmbeddings
from gateway.classifier.embedding_cache import EmbeddingCache
from gateway.classifier.encoder import EncoderSession, default_model_path
from gateway.classifier.head import HeadSession
from gateway.classifier.prompt_features import NAMES
from gateway.classifier.quality_head import ARRAYS, HEAD_FILE, QualityHead
from gateway.classifier.tokenize import PromptTokenizer

__all__ = ["ARRAYS", "HEAD_FILE", "QualityHead", "QualityPredictor", "load_quality_predictor", "open_rubric",
           "read_router_metrics"]


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

    async def predict(self, text: str, *, scope: str = OFFLINE_SCOPE) -> dict[str, float]:
        (row,) = await self.predict_many([text], scope=scope)
        return row

    async def predict_many(self, texts: Sequence[str], *, scope: str = OFFLINE_SCOPE) -> list[dict[str, float]]:
        """One dict per text; the embeddings come through the cache, in `scope` (a tenant's on the serving path:
        gateway.keyspace; a repeated text is encoded once). The head
        (features, kNN search, outputs: ~0.1-0.5 ms a prompt) runs in the loop's default executor, off the loop."""
        if not texts:
            return []
        embeddings, _ = await self.embedder.embed_many(texts, scope=scope)
        loop = asyncio.get_running_loop()
        scores = await loop.run_in_executor(None, self.head.scores, np.stack(embeddings), list(texts))
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
    """The difficulty head the gate reads, refused when its SHA-256 is not the one recorded; None without a gate.

    metrics.json names its folder by `gate.head`, relative to the router folder itself (`gate.head_dir` in
    routers written before: relative to the router folder's parent). A router folder copied elsewhere finds the
    head it was fitted with in the repository's models/ too: the first candidate with the recorded SHA-256 is
    the one read."""
    gate = metrics.get("gate") or {}
    if not gate.get("h0"):
        return None
    found: list[tuple[Path, str]] = []
    for path in rubric_candidates(gate, model_dir):
        if path.is_file():
            if (actual := file_sha256(path)) == gate["head_sha256"]:
                return HeadSession(path)
            found.append((path, actual))
    if found:
        path, actual = found[0]
        raise EncoderMismatch(f"{path} has sha256 {actual[:16]}..., the router's gate was set with "
                              f"{str(gate['head_sha256'])[:16]}...: retrain the router after the difficulty head")
    tried = ", ".join(str(p) for p in rubric_candidates(gate, model_dir))
    raise FileNotFoundError(f"the difficulty head of {model_dir}'s gate is not in {tried}")


def rubric_candidates(gate: dict[str, Any], model_dir: Path) -> list[Path]:
    """Where the gate's difficulty head may be, in order: as metrics.json names it, then the repository's
    models/ folder of that name (a router folder copied away from the head it names)."""
    if "head" in gate:
        named = model_dir / str(gate["head"])
    else:
        named = model_dir.parent / str(gate["head_dir"])
    paths = [(named / HEAD_FILE).resolve(), (shipped_models() / named.resolve().name / HEAD_FILE).resolve()]
    return list(dict.fromkeys(paths))


def shipped_models() -> Path:
    """models/ of the repository the (editable) package lives in."""
    return Path(gateway.__file__).resolve().parents[1] / "models"


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
