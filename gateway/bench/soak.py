"""Soak (bench/soak.py, issue 11): capacity by closed loops at rising concurrency, then an open loop at
half of it for many minutes, the gateway's memory, file descriptors and TTFT sampled every minute."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil
import uvloop

from gateway.bench.arrivals import Arrivals, offsets_within
from gateway.bench.client import RequestResult, send
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import Log
from gateway.bench.procs import RunStart, workdir
from gateway.bench.runner import Sender, closed_loop, open_loop
from gateway.bench.stack import start_stack
from gateway.bench.summary import percentile
from gateway.local.redis_server import EmbeddedRedis

API_KEY = "sk-soak"
HEADERS = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
TIMEOUT = aiohttp.ClientTimeout(total=120, sock_read=60)
MAX_IN_FLIGHT = 2000  # the open loop never holds more requests than this (a stalled gateway shows as errors)
CONCURRENCIES = (4, 8, 16, 32, 64, 128, 256)
STEP_S = 8.0  # each capacity step


@dataclass
class Minute:
    """What one minute of the soak saw."""

    minute: int
    rss_mb: float
    fds: int
    requests: int = 0
    errors: int = 0
    ttft_ms: list[float] = field(default_factory=list)

    def add(self, result: RequestResult) -> None:
        self.requests += 1
        if result.ok and result.ttft_s is not None:
            self.ttft_ms.append(result.ttft_s * 1e3)
        else:
            self.errors += 1

    def row(self) -> dict[str, Any]:
        return {"minute": self.minute, "rss_mb": round(self.rss_mb, 1), "fds": self.fds, "requests": self.requests,
                "errors": self.errors, "p50_ttft_ms": round(percentile(self.ttft_ms, 50), 1),
                "p99_ttft_ms": round(percentile(self.ttft_ms, 99), 1)}


def body(rng: random.Random, max_tokens: int) -> bytes:
    """A streaming chat request; one in five deterministic over 50 prompts (the cache's share)."""
    cached = rng.random() < 0.2
    n = rng.randrange(50) if cached else rng.randrange(10**9)
    extra = ', "temperature": 0' if cached else ""
    return (f'{{"model": "auto", "stream": true, "max_tokens": {max_tokens}, "ignore_eos": true{extra}, '
            f'"messages": [{{"role": "user", "content": "soak prompt {n}: tell me about request {n}"}}]}}').encode()


def sender(session: aiohttp.ClientSession, url: str, rng: random.Random, max_tokens: int) -> Sender:
    async def one(i: int) -> RequestResult:
        return await send(session, url, body(rng, max_tokens), HEADERS)

    return one


async def capacity(session: aiohttp.ClientSession, url: str, max_tokens: int, log: Log) -> dict[str, Any]:
    """The best requests/s of closed loops at rising concurrency, until it stops growing by 5 %."""
    one, steps, best = sender(session, url, random.Random(1), max_tokens), [], 0.0
    for concurrency in CONCURRENCIES:
        run = await closed_loop(one, None, concurrency, duration_s=STEP_S)
        rps = sum(r.ok for r in run.results) / run.duration_s
        steps.append({"concurrency": concurrency, "rps": round(rps, 1), "errors": sum(not r.ok for r in run.results)})
        log(f"  capacity step c={concurrency}: {rps:.1f} req/s, {steps[-1]['errors']} errors")
        if rps < best * 1.05:
            break
        best = max(best, rps)
    return {"rps": best, "steps": steps}


async def soak(session: aiohttp.ClientSession, url: str, rate: float, minutes: int, max_tokens: int,
               gateway: psutil.Process, log: Log, minute_s: float = 60.0) -> list[Minute]:
    """Poisson arrivals at `rate` for `minutes`; one Minute per minute (requests by the minute they were
    sent; resources sampled at its end). `minute_s`: the length of a "minute" (tests shorten it)."""
    rows = [Minute(m, 0.0, 0) for m in range(1, minutes + 1)]

    def count(result: RequestResult) -> None:
        rows[min(max(int(result.start_s // minute_s), 0), minutes - 1)].add(result)

    async def sample(t0: float) -> None:
        for row in rows:
            await asyncio.sleep(max(0.0, t0 + minute_s * row.minute - time.perf_counter()))
            row.rss_mb, row.fds = gateway.memory_info().rss / 2**20, gateway.num_fds()
            r = row.row()
            log(f"  minute {row.minute}: rss {r['rss_mb']} MB, fds {r['fds']}, {r['requests']} req "
                f"({r['errors']} errors), p99 TTFT {r['p99_ttft_ms']} ms")

    times = offsets_within(Arrivals("poisson", rate, seed=2), minute_s * minutes)
    sampler = asyncio.create_task(sample(time.perf_counter()))
    await open_loop(sender(session, url, random.Random(2), max_tokens), times, max_concurrency=MAX_IN_FLIGHT,
                    shed=True, on_result=count)
    await sampler
    return rows


def verdict(rows: Sequence[Minute]) -> dict[str, Any]:
    first, last = rows[0], rows[-1]
    growth = (last.rss_mb - first.rss_mb) / first.rss_mb
    p99_first, p99_last = percentile(first.ttft_ms, 99), percentile(last.ttft_ms, 99)
    return {"rss_growth_pct": round(100 * growth, 2), "rss_ok": growth < 0.05,
            "fd_growth": last.fds - first.fds, "fds_ok": last.fds <= first.fds,
            "p99_ratio": round(p99_last / p99_first, 3), "p99_ok": p99_last <= 1.5 * p99_first,
            "errors": sum(r.errors for r in rows)}


async def measure(args: argparse.Namespace, gateway_url: str, gateway: psutil.Process, log: Log) -> dict[str, Any]:
    url = f"{gateway_url}/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=TIMEOUT) as session:
        found = await capacity(session, url, args.max_tokens, log)
        rate = found["rps"] / 2
        log(f"capacity {found['rps']:.1f} req/s: soaking at {rate:.1f} req/s for {args.minutes} min")
        rows = await soak(session, url, rate, args.minutes, args.max_tokens, gateway, log)
    return {"capacity": found, "rate_rps": rate, "minutes": [r.row() for r in rows], "verdict": verdict(rows)}


def run(args: argparse.Namespace, start: RunStart, log: Log) -> dict[str, Any]:
    """Redis, two emulators (one tier) and the gateway; capacity, then the soak; stops them all."""
    with EmbeddedRedis() as redis, workdir(start.procs, "soak-") as tmp:
        stack = start_stack(start.procs, tmp,
                            lambda urls: routes_yaml({"t": [(f"t-{i}", url) for i, url in enumerate(urls)]}),
                            policy_yaml("t", [{"name": "soak", "key": API_KEY}]), emulators=2,
                            profile=args.profile, redis_url=redis.url, gw_cpu=start.gw_cpu)
        gateway = psutil.Process(stack.gateway_pid)
        if gateway.name() == "taskset" or gateway.children():  # taskset execs, but be sure to sample python
            gateway = next((c for c in gateway.children(recursive=True)), gateway)
        result = uvloop.run(measure(args, stack.gateway_url, gateway, log))
        start.procs.check_alive()
    return result
