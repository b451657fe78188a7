"""The workload of issue 30's balance tests: one long non-streamed answer first (the sample that used to starve
its replica), then a mix of streaming and non-streaming requests, a few at a time, through a gateway; what
share each replica took and the TTFT clients saw on the streams."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.testing import TEST_API_KEY


@dataclass
class BalanceRun:
    backends: Counter[str] = field(default_factory=Counter)  # x-gateway-backend of the mixed requests
    ttfts_s: list[float] = field(default_factory=list)  # the streams' time to their first content
    trigger_backend: str = ""

    def share(self, backend: str) -> float:
        return self.backends[backend] / sum(self.backends.values())

    def p99_ttft_s(self) -> float:
        ordered = sorted(self.ttfts_s)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def _send(session: aiohttp.ClientSession, url: str, body: dict[str, Any], run: BalanceRun | None) -> str:
    started = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        backend = response.headers["x-gateway-backend"]
        if body.get("stream"):
            first: float | None = None
            async for line in response.content:
                if first is None and line.startswith(b"data: {") and b'"content"' in line:
                    first = time.perf_counter() - started
            if run is not None:
                assert first is not None, "a stream without content"
                run.ttfts_s.append(first)
        else:
            answer = orjson.loads(await response.read())
            assert answer["choices"][0]["message"]["content"] is not None
    if run is not None:
        run.backends[backend] += 1
    return backend


async def mixed_load(url: str, *, requests: int, concurrency: int, max_tokens: int, trigger_tokens: int,
                     run_name: str, extra: dict[str, Any] | None = None) -> BalanceRun:
    """The trigger (a non-streamed answer of `trigger_tokens`), then `requests` requests, every other one
    streamed, `concurrency` at a time, each of `max_tokens`. Prompts start with `run_name`: a run finds none
    of them in a server's prompt cache from an earlier run (which would make that server faster for them)."""
    run = BalanceRun()
    extra = extra or {}

    def body(i: int, stream: bool, tokens: int) -> dict[str, Any]:
        text = f"{run_name}, request {i}: write a short line about the number {i}."
        return {"model": "t", "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
                "stream": stream, **extra}

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as session:
        run.trigger_backend = await _send(session, url, body(-1, False, trigger_tokens), None)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                await _send(session, url, body(i, i % 2 == 0, max_tokens), run)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return run
