"""The serving difficulty scorer: prompt -> embedding (LRU, shared store, encoder) -> ONNX head.

    clf = load_classifier(Path("models/difficulty"), store=embedding_store)
    difficulty = await clf.score(prompt)      # in [0, 1]; clf.embedding(prompt) for reuse

The embedding comes from the in-process LRU, else the optional shared store (the Redis
EmbeddingStore: any object with async get_many / put_many), else the micro-batched encoder, whose
result is written back to the store in the background. A store that fails or answers None is a
miss, never an error. The head runs inline: one tiny ONNX call of a few microseconds.
`load_classifier` reads head.onnx + metrics.json and refuses an encoder file whose SHA-256
differs from the one the head was trained or evaluated with.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import structlog

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.embedding_cache import EmbeddingCache, cache_key
from gateway.classifier.encoder import (
    EMBEDDING_DIM,
    GPU_VARIANT,
    EncoderSession,
    default_model_path,
    default_providers,
)
from gateway.classifier.head import HeadSession

log = structlog.get_logger("gateway.classifier")
Embedding = npt.NDArray[np.float32]


class EncoderMismatch(ValueError):
    """The encoder file on disk is not the one the head was trained or evaluated with."""


class SharedEmbeddings(Protocol):
    """A second-level embedding store shared by replicas (gateway.cache.embeddings.EmbeddingStore)."""

    async def get_many(self, keys: Sequence[str]) -> list[Embedding | None]: ...

    async def put_many(self, items: Sequence[tuple[str, Embedding]]) -> None: ...


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class DifficultyClassifier:
    """`score(text)` in [0, 1] (the DifficultyScorer protocol); `close()` when done."""

    def __init__(
        self,
        batcher: MicroBatcher,
        head: HeadSession,
        *,
        store: SharedEmbeddings | None = None,
        cache: EmbeddingCache | None = None,
        provider: str = "CPUExecutionProvider",
        encoder_variant: str = "",
    ) -> None:
        self.batcher = batcher
        self.head = head
        self.store = store
        self.cache = cache or EmbeddingCache()
        self.provider = provider
        self.encoder_variant = encoder_variant
        self.store_hits = 0
        self.encoded = 0
        self._writes: set[asyncio.Task[None]] = set()

    async def score(self, text: str) -> float:
        """The prompt's difficulty for the small tier, in [0, 1]."""
        embedding = await self.embedding(text)
        length = np.array([[math.log1p(len(text))]], dtype=np.float32)
        return float(self.head.score(embedding.reshape(1, -1), length)[0])

    async def embedding(self, text: str) -> Embedding:
        """The prompt's read-only embedding (384,): LRU, then the shared store, then the encoder."""
        key = cache_key(text)
        if (hit := self.cache.get(key)) is not None:
            return hit
        if self.store is not None and (shared := await self._from_store(key)) is not None:
            self.store_hits += 1
            return self.cache.put(key, shared)
        embedding = self.cache.put(key, await self.batcher.embed(text))
        self.encoded += 1
        if self.store is not None:
            task = asyncio.get_running_loop().create_task(self._to_store(self.store, key, embedding))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return embedding

    async def _from_store(self, key: str) -> Embedding | None:
        assert self.store is not None
        try:
            (found,) = await self.store.get_many([key])
        except Exception as err:  # the store is an accelerator: a failure is a miss
            log.warning("embedding_store_get_failed", error=f"{type(err).__name__}: {err}")
            return None
        if found is None or np.shape(found) != (EMBEDDING_DIM,):
            return None
        return np.asarray(found, dtype=np.float32)

    @staticmethod
    async def _to_store(store: SharedEmbeddings, key: str, embedding: Embedding) -> None:
        try:
            await store.put_many([(key, embedding)])
        except Exception as err:
            log.warning("embedding_store_put_failed", error=f"{type(err).__name__}: {err}")

    async def drain(self) -> None:
        """Wait for the background writes to the shared store."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    def close(self) -> None:
        """Stop the batcher and cancel pending store writes."""
        self.batcher.close()
        for task in list(self._writes):
            task.cancel()

    async def aclose(self) -> None:
        """Finish the store writes, then close."""
        await self.drain()
        self.close()


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


def open_parts(
    model_dir: Path, *, encoder_variant: str | None = None, providers: Sequence[str] | None = None, threads: int = 1
) -> tuple[EncoderSession, HeadSession, str]:
    """The checked encoder session, the head session and the encoder variant chosen."""
    metrics = read_metrics(model_dir)
    chosen = list(providers) if providers is not None else default_providers()
    variant = choose_variant(metrics, encoder_variant, chosen)
    known = _known_encoders(metrics)
    path = default_model_path(variant)
    expected, actual = str(known[variant]["sha256"]), file_sha256(path)
    if actual != expected:
        raise EncoderMismatch(
            f"{path} has sha256 {actual[:16]}..., but {model_dir / 'metrics.json'} records {expected[:16]}... "
            f"for encoder variant {variant}: the head was trained on another encoder file; restore that "
            "file or retrain the head with `gateway train`"
        )
    encoder = EncoderSession(path, providers=chosen, threads=threads)
    return encoder, HeadSession(model_dir / "head.onnx"), variant


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
    encoder, head, variant = open_parts(model_dir, encoder_variant=encoder_variant, providers=providers, threads=threads)
    batcher = MicroBatcher(encoder, window_s=window_s, max_batch=max_batch)
    return DifficultyClassifier(
        batcher, head, store=store, cache=EmbeddingCache(cache_entries), provider=encoder.provider,
        encoder_variant=variant,
    )
