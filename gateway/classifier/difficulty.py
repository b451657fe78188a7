"""The serving difficulty scorer: prompt -> features (CachedEmbedder) -> ONNX head.

    clf = load_classifier(Path("models/difficulty"), store=embedding_store)
    difficulty = await clf.score(prompt)      # in [0, 1]

The features come from the head's encoder graph (metrics.json `encoder.graph`: `difficulty`, the
first 4 MiniLM layers, since v2) through a CachedEmbedder: in-process LRU, else the optional shared
store, else the micro-batched encoder. The head runs inline: one tiny ONNX call of a few
microseconds. `load_classifier` reads head.onnx + metrics.json and refuses an encoder file whose
SHA-256 differs from the one the head was trained or evaluated with. `sentence_embedder` gives the
semantic cache its own embedder on the 6-layer sentence graph, opened on first use.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.embedder import CachedEmbedder, LazyEncoder, SharedEmbeddings
from gateway.classifier.embedding_cache import EmbeddingCache
from gateway.classifier.encoder import (
    GPU_VARIANT,
    GRAPHS,
    SENTENCE,
    EncoderSession,
    Graph,
    default_model_path,
    default_providers,
    preferred_variant,
)
from gateway.classifier.head import HeadSession


class EncoderMismatch(ValueError):
    """The encoder file on disk is not the one the head was trained or evaluated with."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class DifficultyClassifier:
    """`score(text)` in [0, 1] (the DifficultyScorer protocol); `close()` when done."""

    def __init__(
        self, embedder: CachedEmbedder, head: HeadSession, *, provider: str = "CPUExecutionProvider",
        encoder_variant: str = "",
    ) -> None:
        self.embedder = embedder
        self.head = head
        self.provider = provider
        self.encoder_variant = encoder_variant

    async def score(self, text: str) -> float:
        """The prompt's difficulty for the small tier, in [0, 1]."""
        features = await self.embedder.embedding(text)
        length = np.array([[math.log1p(len(text))]], dtype=np.float32)
        return float(self.head.score(features.reshape(1, -1), length)[0])

    def close(self) -> None:
        self.embedder.close()

    async def aclose(self) -> None:
        await self.embedder.aclose()


def read_metrics(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: train the head with `gateway train --out {model_dir}`")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _known_encoders(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Encoder variants the head may run on: the trained one, plus those evaluated as compatible."""
    trained = metrics["encoder"]
    known = dict(metrics.get("compatible_encoders") or {})
    known = {v: e for v, e in known.items() if e.get("compatible", True)}
    known[str(trained["variant"])] = trained
    return known


def choose_variant(metrics: dict[str, Any], wanted: str | None, providers: Sequence[str]) -> str:
    """`wanted`, else the GPU variant on CUDA when the head was evaluated with it, else the trained one."""
    trained = str(metrics["encoder"]["variant"])
    known = _known_encoders(metrics)
    if wanted is not None:
        if wanted not in known:
            raise EncoderMismatch(
                f"the head was trained/evaluated with encoder variants {sorted(known)}, not {wanted!r}; "
                f"retrain with `gateway train --encoder-variant {wanted}` (or --eval-variants {wanted})"
            )
        return wanted
    on_gpu = bool(providers) and providers[0] == "CUDAExecutionProvider"
    return GPU_VARIANT if on_gpu and GPU_VARIANT in known else trained


def encoder_graph(metrics: dict[str, Any]) -> Graph:
    """The graph the head reads (metrics.json `encoder.graph`; heads from before v2 read `sentence`)."""
    name = str(metrics["encoder"].get("graph", SENTENCE.name))
    if name not in GRAPHS:
        raise EncoderMismatch(f"metrics.json names encoder graph {name!r}; this gateway knows {sorted(GRAPHS)}")
    return GRAPHS[name]


def open_parts(
    model_dir: Path, *, encoder_variant: str | None = None, providers: Sequence[str] | None = None, threads: int = 1
) -> tuple[EncoderSession, HeadSession, str, str]:
    """The checked encoder session, the head session, the encoder variant chosen and its file's SHA-256."""
    metrics = read_metrics(model_dir)
    chosen = list(providers) if providers is not None else default_providers()
    variant = choose_variant(metrics, encoder_variant, chosen)
    known = _known_encoders(metrics)
    path = default_model_path(variant, encoder_graph(metrics))
    expected, actual = str(known[variant]["sha256"]), file_sha256(path)
    if actual != expected:
        raise EncoderMismatch(
            f"{path} has sha256 {actual[:16]}..., but {model_dir / 'metrics.json'} records {expected[:16]}... "
            f"for encoder variant {variant}: the head was trained on another encoder file; restore that "
            "file or retrain the head with `gateway train`"
        )
    encoder = EncoderSession(path, providers=chosen, threads=threads)
    return encoder, HeadSession(model_dir / "head.onnx"), variant, actual


def namespace_of(path: Path, sha256: str) -> str:
    """The shared-store namespace of an encoder file: its name and the start of its SHA-256."""
    return f"{path.stem}.{sha256[:12]}"


def load_classifier(
    model_dir: Path,
    *,
    encoder_variant: str | None = None,
    providers: Sequence[str] | None = None,
    store: SharedEmbeddings | None = None,
    threads: int = 1,
    cache_entries: int = 4096,
    window_s: float = 0.002,
    max_batch: int = 32,
) -> DifficultyClassifier:
    """A ready DifficultyClassifier for the trained model in `model_dir` (blocking: call at startup)."""
    encoder, head, variant, sha = open_parts(model_dir, encoder_variant=encoder_variant, providers=providers, threads=threads)
    embedder = CachedEmbedder(
        MicroBatcher(encoder, window_s=window_s, max_batch=max_batch), namespace=namespace_of(encoder.model_path, sha),
        store=store, cache=EmbeddingCache(cache_entries),
    )
    return DifficultyClassifier(embedder, head, provider=encoder.provider, encoder_variant=variant)


def sentence_embedder(
    provider: str, *, store: SharedEmbeddings | None = None, threads: int = 1,
    cache_entries: int = 4096, window_s: float = 0.002, max_batch: int = 32,
) -> CachedEmbedder:
    """The semantic cache's embedder on `provider` (the classifier's): all-MiniLM-L6-v2's sentence
    embedding (6 layers), opened on first use."""
    variant = preferred_variant(SENTENCE, [provider])
    run_on = [provider, "CPUExecutionProvider"] if variant == GPU_VARIANT else ["CPUExecutionProvider"]
    path = default_model_path(variant, SENTENCE)
    lazy = LazyEncoder(lambda: EncoderSession(path, providers=run_on, threads=threads))
    return CachedEmbedder(
        MicroBatcher(lazy, window_s=window_s, max_batch=max_batch), namespace=namespace_of(path, file_sha256(path)),
        store=store, cache=EmbeddingCache(cache_entries),
    )
