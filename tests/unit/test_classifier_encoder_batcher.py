"""MicroBatcher and EmbeddingCache with a fake encoder: batching, fan-out, errors, cancellation, LRU."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.embedding_cache import EmbeddingCache, cache_key


class FakeEncoder:
    """Embeds a text as [len(text), 0, ...]; records each call's texts; can sleep or fail."""

    def __init__(self, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()
        self.delay_s = delay_s
        self.error = error

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)  # blocking on purpose: it must not block the event loop
        if self.error is not None:
            raise self.error
        out = np.zeros((len(texts), 384), dtype=np.float32)
        out[:, 0] = [len(t) for t in texts]
        return out


async def test_concurrent_callers_share_one_encoder_call() -> None:
    encoder = FakeEncoder()
    batcher = MicroBatcher(encoder, window_s=0.02, max_batch=32)
    texts = [f"prompt {'x' * i}" for i in range(10)]
    results = await asyncio.gather(*(batcher.embed(t) for t in texts))
    batcher.close()
    assert len(encoder.calls) == 1 and sorted(encoder.calls[0]) == sorted(texts)
    assert [r[0] for r in results] == [len(t) for t in texts]  # each caller gets its own row
    assert all(r.shape == (384,) and r.dtype == np.float32 for r in results)
    assert encoder.threads != {threading.current_thread().name}


async def test_max_batch_splits_and_later_arrivals_form_the_next_batch() -> None:
    encoder = FakeEncoder(delay_s=0.05)
    batcher = MicroBatcher(encoder, window_s=0.01, max_batch=4)
    results = await asyncio.gather(*(batcher.embed(str(i)) for i in range(10)))
    batcher.close()
    assert [len(call) for call in encoder.calls] == [4, 4, 2]
    assert batcher.batches == 3 and len(results) == 10


async def test_a_lone_caller_waits_at_most_about_the_window() -> None:
    encoder = FakeEncoder()
    batcher = MicroBatcher(encoder, window_s=0.01)
    start = time.perf_counter()
    await batcher.embed("alone")
    elapsed = time.perf_counter() - start
    batcher.close()
    assert encoder.calls == [["alone"]]
    assert 0.009 <= elapsed < 0.5


async def test_the_event_loop_keeps_running_while_the_encoder_works() -> None:
    encoder = FakeEncoder(delay_s=0.2)
    batcher = MicroBatcher(encoder, window_s=0.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await batcher.embed("slow")
    task.cancel()
    batcher.close()
    assert ticks >= 10  # about 20 ticks fit in 0.2 s; a blocked loop would give 0 or 1


async def test_an_encoder_error_reaches_every_waiter() -> None:
    batcher = MicroBatcher(FakeEncoder(error=ValueError("boom")), window_s=0.01)
    results = await asyncio.gather(*(batcher.embed(str(i)) for i in range(3)), return_exceptions=True)
    batcher.close()
    assert len(results) == 3
    assert all(isinstance(r, ValueError) and str(r) == "boom" for r in results)


async def test_a_cancelled_waiter_does_not_break_the_batch() -> None:
    encoder = FakeEncoder(delay_s=0.05)
    batcher = MicroBatcher(encoder, window_s=0.01)
    doomed = asyncio.create_task(batcher.embed("doomed"))
    kept = asyncio.create_task(batcher.embed("kept"))
    await asyncio.sleep(0)
    doomed.cancel()
    assert (await kept)[0] == len("kept")
    assert doomed.cancelled()
    assert encoder.calls == [["kept"]]  # cancelled before the batch started: dropped from it
    # cancelled while its batch runs: the others still get their results
    running = [asyncio.create_task(batcher.embed(t)) for t in ("a", "bb")]
    await asyncio.sleep(0.03)
    running[0].cancel()
    assert (await running[1])[0] == 2
    batcher.close()


async def test_close_cancels_waiters_and_refuses_new_texts() -> None:
    batcher = MicroBatcher(FakeEncoder(), window_s=10.0)
    waiter = asyncio.create_task(batcher.embed("never"))
    await asyncio.sleep(0)
    batcher.close()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    with pytest.raises(RuntimeError, match="closed"):
        await batcher.embed("late")


async def test_cache_hits_skip_the_encoder_and_identical_texts_are_embedded_once() -> None:
    encoder = FakeEncoder()
    cache = EmbeddingCache(max_entries=8)
    batcher = MicroBatcher(encoder, window_s=0.005, cache=cache)
    first = await asyncio.gather(batcher.embed("same  text "), batcher.embed("same text"))
    again = await batcher.embed("\tsame text")
    batcher.close()
    assert encoder.calls == [["same  text "]]
    assert np.array_equal(first[0], first[1]) and np.array_equal(again, first[0])
    assert (cache.hits, cache.misses, len(cache)) == (1, 2, 1)


def test_cache_key_normalizes_whitespace_only() -> None:
    assert cache_key("  a \n\t b ") == cache_key("a b")
    assert cache_key("a b") != cache_key("A b") != cache_key("ab")
    assert len(cache_key("")) == 64


def test_lru_evicts_the_least_recently_used_and_counts() -> None:
    cache = EmbeddingCache(max_entries=2)
    vec = np.ones(384, dtype=np.float32)
    cache.put("a", vec)
    cache.put("b", vec * 2)
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", vec * 3)
    assert cache.get("b") is None
    stored = cache.get("a")
    assert stored is not None and stored[0] == 1.0 and not stored.flags.writeable
    assert (cache.hits, cache.misses, len(cache)) == (2, 1, 2)
    assert cache.hit_ratio == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        EmbeddingCache(max_entries=0)
