"""Offline batch embedding for training and calibration: `embed_texts` (shortest texts first,
a progress bar on stderr) and `EmbeddingFile`, an optional on-disk cache of one encoder file's embeddings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.classifier.embedding_cache import cache_key
from gateway.classifier.encoder import EMBEDDING_DIM, EncoderSession


class Progress:
    """A one-line progress bar on stderr (redrawn at most every 0.2 s)."""

    def __init__(self, total: int, label: str, width: int = 30) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.done, self.started, self._drawn = 0, time.perf_counter(), 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self._drawn >= 0.2 or self.done >= self.total:
            self._drawn = now
            filled = self.width * self.done // self.total
            rate = self.done / max(now - self.started, 1e-9)
            bar = "#" * filled + "." * (self.width - filled)
            print(f"\r{self.label} [{bar}] {self.done}/{self.total} {rate:.1f}/s", end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr, flush=True)


def embed_texts(encoder: EncoderSession, texts: Sequence[str], label: str, batch: int = 32) -> npt.NDArray[np.float32]:
    """Embeddings (n, 384) in batches of `batch`, shortest texts first (less padding); progress on stderr."""
    out = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    progress = Progress(len(texts), f"embed {label}")
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        out[idx] = encoder.embed([texts[i] for i in idx])
        progress.update(len(idx))
    progress.close()
    return out


class EmbeddingFile:
    """Optional on-disk cache of embeddings for one encoder file and token window (an .npz keyed by cache_key)."""

    def __init__(self, directory: Path | None, encoder_sha256: str, max_tokens: int = 256) -> None:
        window = "" if max_tokens == 256 else f".t{max_tokens}"
        self.path = directory / f"{encoder_sha256[:16]}{window}.npz" if directory else None
        self.rows: dict[str, npt.NDArray[np.float32]] = {}
        if self.path is not None and self.path.is_file():
            with np.load(self.path) as data:
                self.rows = dict(zip((str(k) for k in data["keys"]), data["emb"], strict=True))

    def embed(self, encoder: EncoderSession, texts: Sequence[str], label: str) -> npt.NDArray[np.float32]:
        keys = [cache_key(t) for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in self.rows}.items())
        if todo:
            fresh = embed_texts(encoder, [t for _, t in todo], label)
            self.rows.update(zip((k for k, _ in todo), fresh, strict=True))
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp.npz")
                np.savez(tmp, keys=np.array(list(self.rows)), emb=np.stack(list(self.rows.values())))
                tmp.replace(self.path)
        return np.stack([self.rows[k] for k in keys]).astype(np.float32)
