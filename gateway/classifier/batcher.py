"""Micro-batching of encoder calls for asyncio callers.

Concurrent `embed(text)` calls are gathered for at most `window_s` (from the oldest waiting
text) or until `max_batch` texts wait, then ONE `encoder.embed(texts)` runs in a single-thread
executor, so the event loop never blocks (onnxruntime releases the GIL) and one batch runs at a
time. Texts that arrive while a batch runs form the next one. Results are fanned back to the
callers' futures; an exception reaches every caller of that batch; a cancelled caller is simply
dropped. With an EmbeddingCache, hits skip the batch and results fill it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from gateway.classifier.embedding_cache import EmbeddingCache, cache_key

Embedding = npt.NDArray[np.float32]


class Embedder(Protocol):
    def embed(self, texts: Sequence[str]) -> Embedding: ...


@dataclass(slots=True)
class _Waiter:
    text: str
    key: str
    future: asyncio.Future[Embedding]
    since: float


class MicroBatcher:
    """Gathers concurrent texts into batches for one encoder; `close()` when done."""

    def __init__(
        self,
        encoder: Embedder,
        *,
        window_s: float = 0.002,
        max_batch: int = 32,
        cache: EmbeddingCache | None = None,
    ) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError(f"need max_batch >= 1 and window_s >= 0, got {max_batch} and {window_s}")
        self.window_s = window_s
        self.max_batch = max_batch
        self.cache = cache
        self.batches = 0  # encoder calls made
        self._encoder = encoder
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encoder")
        self._waiting: list[_Waiter] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None
        self._closed = False

    async def embed(self, text: str) -> Embedding:
        """The embedding (384,) of `text`, batched with whatever else is waiting."""
        if self._closed:
            raise RuntimeError("MicroBatcher is closed")
        key = cache_key(text)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Embedding] = loop.create_future()
        self._waiting.append(_Waiter(text, key, future, loop.time()))
        self._schedule(loop)
        return await future

    def close(self) -> None:
        """Stop accepting texts, cancel those still waiting, shut the executor down."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter in self._waiting:
            waiter.future.cancel()
        self._waiting.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a batch now if one is due, else arm the timer for the oldest waiter's window."""
        if self._running is not None or not self._waiting:
            return
        due = self._waiting[0].since + self.window_s
        if len(self._waiting) >= self.max_batch or loop.time() >= due:
            self._start(loop)
        elif self._timer is None:
            self._timer = loop.call_at(due, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._schedule(loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        live = [w for w in self._waiting if not w.future.done()]
        batch, self._waiting = live[: self.max_batch], live[self.max_batch :]
        if batch:
            self._running = loop.create_task(self._run(batch))

    async def _run(self, batch: list[_Waiter]) -> None:
        loop = asyncio.get_running_loop()
        texts: dict[str, str] = {}  # identical (normalized) texts are embedded once
        for w in batch:
            texts.setdefault(w.key, w.text)
        keys = list(texts)
        try:
            self.batches += 1
            rows = await loop.run_in_executor(self._executor, self._encoder.embed, list(texts.values()))
            if len(rows) != len(keys):
                raise RuntimeError(f"encoder returned {len(rows)} embeddings for {len(keys)} texts")
        except asyncio.CancelledError:
            for w in batch:
                w.future.cancel()
            raise
        except Exception as exc:  # every waiter of the batch gets it
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
        else:
            by_key = {k: self._store(k, row) for k, row in zip(keys, rows, strict=True)}
            for w in batch:
                if not w.future.done():
                    w.future.set_result(by_key[w.key])
        finally:
            self._running = None
            if not self._closed:
                self._schedule(loop)

    def _store(self, key: str, row: Embedding) -> Embedding:
        if self.cache is not None:
            return self.cache.put(key, row)
        stored = np.array(row, dtype=np.float32, copy=True)
        stored.flags.writeable = False
        return stored
