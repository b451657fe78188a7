"""Drive a server with a list of requests: open loop (a send schedule) or closed loop (concurrency).

Both stop sending at `duration_s` when given; requests still in flight then get `drain_s` to
finish, after which they are cancelled and reported as failed ("unfinished"). The result's
`duration_s` runs from the first send to the last completion, as throughput's denominator.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.bench.client import RequestResult, request_body, request_headers, send
from gateway.bench.workload import RequestSpec

OnResult = Callable[[RequestResult], None]


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send: base URL (…/v1), model name, auth, extra headers and body fields."""

    base_url: str
    model: str
    api_key: str | None = None
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    ignore_eos: bool = True

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(slots=True)
class RunResult:
    """Every request's result (in completion order) and the run's wall time."""

    results: list[RequestResult]
    duration_s: float
    started_at: float  # time.time() at the first send


def open_session(timeout_s: float = 300.0) -> aiohttp.ClientSession:
    """A client session without a connection cap, `timeout_s` for each read."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False), timeout=timeout)


class _Run:
    def __init__(self, target: Target, session: aiohttp.ClientSession, on_result: OnResult | None) -> None:
        self.target, self.session, self.on_result = target, session, on_result
        self.headers = request_headers(target.api_key, target.extra_headers)
        self.results: list[RequestResult] = []
        self.t0 = time.perf_counter()
        self.started_at = time.time()

    async def one(self, spec: RequestSpec) -> None:
        t = self.target
        body = request_body(spec, t.model, t.ignore_eos, t.extra_body)
        result = await send(self.session, t.url, body, self.headers, spec, time.perf_counter() - self.t0)
        self.results.append(result)
        if self.on_result:
            self.on_result(result)

    async def finish(self, tasks: Sequence[asyncio.Task[None]], drain_s: float) -> RunResult:
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self.results += [RequestResult(False, error="unfinished", start_s=-1.0) for _ in pending]
        return RunResult(self.results, time.perf_counter() - self.t0, self.started_at)


async def _with_session(session: aiohttp.ClientSession | None, timeout_s: float,
                        body: Callable[[aiohttp.ClientSession], Awaitable[RunResult]]) -> RunResult:
    if session is not None:
        return await body(session)
    async with open_session(timeout_s) as own:
        return await body(own)


async def run_open_loop(target: Target, specs: Sequence[RequestSpec], offsets: Sequence[float], *,
                        duration_s: float | None = None, max_concurrency: int | None = None,
                        drain_s: float = 300.0, on_result: OnResult | None = None,
                        session: aiohttp.ClientSession | None = None) -> RunResult:
    """Send specs[i] at offsets[i] seconds (whatever is in flight); stop sending at `duration_s`.
    `max_concurrency` caps requests in flight (later sends wait for a slot, as in vLLM)."""

    async def body(s: aiohttp.ClientSession) -> RunResult:
        run = _Run(target, s, on_result)
        limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None

        async def one(spec: RequestSpec) -> None:
            if limit is None:
                return await run.one(spec)
            async with limit:
                return await run.one(spec)

        tasks: list[asyncio.Task[None]] = []
        for spec, offset in zip(specs, offsets):
            if duration_s is not None and offset >= duration_s:
                break
            delay = run.t0 + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(spec)))
        return await run.finish(tasks, drain_s)

    return await _with_session(session, drain_s, body)


async def run_closed_loop(target: Target, specs: Sequence[RequestSpec], concurrency: int, *,
                          duration_s: float | None = None, drain_s: float = 300.0,
                          on_result: OnResult | None = None,
                          session: aiohttp.ClientSession | None = None) -> RunResult:
    """`concurrency` workers send back to back: each spec once, or (with `duration_s`) cycling
    through the specs until the duration ends."""

    async def body(s: aiohttp.ClientSession) -> RunResult:
        run = _Run(target, s, on_result)
        todo: Iterator[RequestSpec] = itertools.cycle(specs) if duration_s is not None else iter(specs)
        deadline = run.t0 + (duration_s if duration_s is not None else float("inf"))

        async def worker() -> None:
            for spec in todo:
                if time.perf_counter() >= deadline:
                    return
                await run.one(spec)

        workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))] if specs else []
        if duration_s is not None and workers:
            await asyncio.wait(workers, timeout=duration_s)
        return await run.finish(workers, drain_s)

    return await _with_session(session, drain_s, body)
