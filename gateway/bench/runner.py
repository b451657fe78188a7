"""The load generator: send requests to a server in an open loop (a send schedule) or a closed loop
(a fixed number of workers back to back), and collect every request's result.

`closed_loop` and `open_loop` drive any `Sender`, an async function that sends the i-th request of
the run and returns its `RequestResult` without raising (`client.send`, `client.send_json`, or a
benchmark's own). `run_closed_loop` and `run_open_loop` do it for a list of `RequestSpec` sent to a
`Target`, streaming. Both loops stop sending at `duration_s` when given; requests still in flight
then get `drain_s` to finish, after which they are cancelled and reported as failed ("unfinished").
The result's `duration_s` runs from the first send to the last completion, as throughput's denominator.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gateway.bench.client import RequestResult, request_body, request_headers, send
from gateway.bench.workload import RequestSpec

OnResult = Callable[[RequestResult], None]
Sender = Callable[[int], Awaitable[RequestResult]]  # sends request i of the run, timed; never raises


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
    truncated: bool = False  # a closed loop of n requests stopped at its duration before sending them all


def merge_runs(runs: Sequence[RunResult]) -> RunResult:
    """Runs measured in slices as one: the results together, the wall times summed."""
    return RunResult([r for run in runs for r in run.results], sum(run.duration_s for run in runs),
                     runs[0].started_at if runs else time.time(), any(run.truncated for run in runs))


def open_session(timeout_s: float = 300.0) -> aiohttp.ClientSession:
    """A client session without a connection cap, `timeout_s` for each read."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=False), timeout=timeout)


class _Run:
    def __init__(self, sender: Sender, on_result: OnResult | None) -> None:
        self.sender, self.on_result = sender, on_result
        self.results: list[RequestResult] = []
        self.t0 = time.perf_counter()
        self.started_at = time.time()

    async def one(self, index: int) -> None:
        start = time.perf_counter() - self.t0
        self.add(await self.sender(index), index, start)

    def add(self, result: RequestResult, index: int, start: float) -> None:
        result.index, result.start_s = index, start
        self.results.append(result)
        if self.on_result:
            self.on_result(result)

    async def finish(self, tasks: Sequence[asyncio.Task[None]], drain_s: float) -> RunResult:
        """Wait up to `drain_s` for `tasks`, cancel the rest ("unfinished"); a sender's exception propagates."""
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=drain_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
            self.results += [RequestResult(False, error="unfinished", start_s=-1.0) for _ in pending]
        return RunResult(self.results, time.perf_counter() - self.t0, self.started_at)


async def closed_loop(sender: Sender, n: int | None, concurrency: int, *, duration_s: float | None = None,
                      drain_s: float = 300.0, think_s: float = 0.0, seed: int = 0,
                      on_result: OnResult | None = None) -> RunResult:
    """`concurrency` workers send requests 0, 1, 2, ... back to back, each worker the next index not yet
    taken, `n` in all (None: no end but `duration_s`). `think_s`: each worker pauses uniform [0, think_s]
    before each request (its own random stream, from `seed`). At `duration_s` the workers stop taking
    requests (`truncated` when some of the `n` were never sent)."""
    run = _Run(sender, on_result)
    todo: Iterator[int] = iter(range(n)) if n is not None else itertools.count()
    deadline = run.t0 + (duration_s if duration_s is not None else math.inf)
    stopped = False

    async def worker(k: int) -> None:
        nonlocal stopped
        rng = random.Random(seed * 100_003 + k)
        for i in todo:
            if time.perf_counter() >= deadline:
                stopped = True
                return
            if think_s:
                await asyncio.sleep(rng.uniform(0.0, think_s))
            await run.one(i)

    count = max(1, concurrency if n is None else min(concurrency, n))
    workers = [asyncio.create_task(worker(k)) for k in range(count)] if n != 0 else []
    if duration_s is not None and workers:
        await asyncio.wait(workers, timeout=duration_s)
    result = await run.finish(workers, drain_s)
    result.truncated = stopped and n is not None
    return result


async def open_loop(sender: Sender, offsets: Sequence[float], *, duration_s: float | None = None,
                    max_concurrency: int | None = None, shed: bool = False, drain_s: float = 300.0,
                    on_result: OnResult | None = None) -> RunResult:
    """Send request i at offsets[i] seconds (whatever is in flight); stop sending at `duration_s`.
    `max_concurrency` caps requests in flight: later sends wait for a slot (as in vLLM), or with `shed`
    are not sent and fail at once ("in-flight cap")."""
    run = _Run(sender, on_result)
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency and not shed else None
    in_flight: set[asyncio.Task[None]] = set()
    tasks: list[asyncio.Task[None]] = []

    async def one(i: int) -> None:
        if limit is None:
            return await run.one(i)
        async with limit:
            return await run.one(i)

    for i, offset in enumerate(offsets):
        if duration_s is not None and offset >= duration_s:
            break
        delay = run.t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if shed and max_concurrency and len(in_flight) >= max_concurrency:
            run.add(RequestResult(False, error="in-flight cap"), i, time.perf_counter() - run.t0)
            continue
        task = asyncio.create_task(one(i))
        tasks.append(task)
        if shed:
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
    return await run.finish(tasks, drain_s)


def spec_sender(target: Target, session: aiohttp.ClientSession, specs: Sequence[RequestSpec]) -> Sender:
    """Streams specs[i % len(specs)] to `target`."""
    headers = request_headers(target.api_key, target.extra_headers)

    async def sender(i: int) -> RequestResult:
        spec = specs[i % len(specs)]
        body = request_body(spec, target.model, target.ignore_eos, target.extra_body)
        return await send(session, target.url, body, headers, spec)

    return sender


@contextlib.asynccontextmanager
async def _session(session: aiohttp.ClientSession | None, timeout_s: float) -> AsyncIterator[aiohttp.ClientSession]:
    if session is not None:
        yield session
        return
    async with open_session(timeout_s) as own:
        yield own


async def run_open_loop(target: Target, specs: Sequence[RequestSpec], offsets: Sequence[float], *,
                        duration_s: float | None = None, max_concurrency: int | None = None,
                        drain_s: float = 300.0, on_result: OnResult | None = None,
                        session: aiohttp.ClientSession | None = None) -> RunResult:
    """Send specs[i] at offsets[i] seconds (whatever is in flight); stop sending at `duration_s`.
    `max_concurrency` caps requests in flight (later sends wait for a slot, as in vLLM)."""
    async with _session(session, drain_s) as s:
        return await open_loop(spec_sender(target, s, specs), offsets[:len(specs)], duration_s=duration_s,
                               max_concurrency=max_concurrency, drain_s=drain_s, on_result=on_result)


async def run_closed_loop(target: Target, specs: Sequence[RequestSpec], concurrency: int, *,
                          duration_s: float | None = None, drain_s: float = 300.0,
                          on_result: OnResult | None = None,
                          session: aiohttp.ClientSession | None = None) -> RunResult:
    """`concurrency` workers send back to back: each spec once, or (with `duration_s`) cycling
    through the specs until the duration ends."""
    n = len(specs) if duration_s is None or not specs else None
    async with _session(session, drain_s) as s:
        return await closed_loop(spec_sender(target, s, specs), n, concurrency, duration_s=duration_s,
                                 drain_s=drain_s, on_result=on_result)
