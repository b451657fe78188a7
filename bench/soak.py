"""Soak: hours-long behaviour in minutes. Half of measured capacity against emulators, sampled per minute.

    .venv/bin/python bench/soak.py [--minutes 20] [--profile int4] [--no-pin]

Starts on 127.0.0.1 a Redis this script controls, two backend emulators (one tier, two replicas)
and the gateway (`gateway serve --redis-url ...`, pinned to its own CPU unless --no-pin). Then:

1. capacity: closed loops of streaming chat requests at rising concurrency (8 s each) until the
   throughput stops growing by 5 %; capacity is the best requests/s seen;
2. soak: an open loop (Poisson arrivals) at half that rate for --minutes minutes, streaming chat,
   one in five requests deterministic (temperature 0 over 50 prompts: cache hits and stores);
3. every minute: the gateway's RSS and open file descriptors (psutil), requests, errors, and p50 /
   p99 TTFT as the client saw it (first content byte).

Verdict (issue 11): RSS growth from the first to the last minute < 5 %, no file-descriptor growth,
p99 TTFT of the last minute within 1.5x of the first. Prints the table; writes
bench/results/soak-<stamp>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _load as L  # noqa: E402

from gateway.local.redis_server import EmbeddedRedis  # noqa: E402

API_KEY = "sk-soak"
TIMEOUT = aiohttp.ClientTimeout(total=120, sock_read=60)
MAX_IN_FLIGHT = 2000  # the open loop never holds more requests than this (a stalled gateway shows as errors)


@dataclass
class Minute:
    """What one minute of the soak saw."""

    minute: int
    rss_mb: float
    fds: int
    requests: int = 0
    errors: int = 0
    ttft_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {"minute": self.minute, "rss_mb": round(self.rss_mb, 1), "fds": self.fds, "requests": self.requests,
                "errors": self.errors, "p50_ttft_ms": round(L.pct(self.ttft_ms, 50), 1),
                "p99_ttft_ms": round(L.pct(self.ttft_ms, 99), 1)}


def body(rng: random.Random, max_tokens: int) -> bytes:
    """A streaming chat request; one in five deterministic over 50 prompts (the cache's share)."""
    cached = rng.random() < 0.2
    n = rng.randrange(50) if cached else rng.randrange(10**9)
    extra = ', "temperature": 0' if cached else ""
    return (f'{{"model": "auto", "stream": true, "max_tokens": {max_tokens}, "ignore_eos": true{extra}, '
            f'"messages": [{{"role": "user", "content": "soak prompt {n}: tell me about request {n}"}}]}}').encode()


async def one(session: aiohttp.ClientSession, url: str, data: bytes) -> float | None:
    """TTFT in ms of one streamed request, None when it failed."""
    t0 = time.perf_counter()
    ttft = None
    try:
        async with session.post(url, data=data, headers={"Authorization": f"Bearer {API_KEY}",
                                                         "Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                await resp.read()
                return None
            tail = b""
            async for piece in resp.content.iter_any():
                if ttft is None and b'"content":"' in piece:
                    ttft = (time.perf_counter() - t0) * 1e3
                tail = (tail + piece)[-64:]
            return ttft if tail.endswith(b"data: [DONE]\n\n") and ttft is not None else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


async def capacity(session: aiohttp.ClientSession, url: str, max_tokens: int, log: Any) -> dict[str, Any]:
    """The best requests/s of closed loops at rising concurrency."""
    rng, steps, best = random.Random(1), [], 0.0
    for concurrency in (4, 8, 16, 32, 64, 128, 256):
        done: list[float | None] = []
        deadline = time.perf_counter() + 8.0

        async def worker() -> None:
            while time.perf_counter() < deadline:
                done.append(await one(session, url, body(rng, max_tokens)))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        rps = sum(d is not None for d in done) / (time.perf_counter() - t0)
        steps.append({"concurrency": concurrency, "rps": round(rps, 1), "errors": sum(d is None for d in done)})
        log(f"  capacity step c={concurrency}: {rps:.1f} req/s, {steps[-1]['errors']} errors")
        if rps < best * 1.05:
            break
        best = max(best, rps)
    return {"rps": best, "steps": steps}


async def soak(session: aiohttp.ClientSession, url: str, rate: float, minutes: int, max_tokens: int,
               gateway: psutil.Process, log: Any) -> list[Minute]:
    """Poisson arrivals at `rate` for `minutes`; one Minute per minute (resources sampled at its end)."""
    rng = random.Random(2)
    rows: list[Minute] = []
    pending: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    for m in range(1, minutes + 1):
        current = Minute(m, 0.0, 0)
        end = start + 60 * m

        async def send(data: bytes, into: Minute) -> None:
            ttft = await one(session, url, data)
            into.requests += 1
            if ttft is None:
                into.errors += 1
            else:
                into.ttft_ms.append(ttft)

        while (now := time.perf_counter()) < end:
            await asyncio.sleep(min(rng.expovariate(rate), end - now))
            if len(pending) >= MAX_IN_FLIGHT:
                current.requests, current.errors = current.requests + 1, current.errors + 1
                continue
            task = asyncio.create_task(send(body(rng, max_tokens), current))
            pending.add(task)
            task.add_done_callback(pending.discard)
        current.rss_mb = gateway.memory_info().rss / 2**20
        current.fds = gateway.num_fds()
        rows.append(current)
        r = current.row()
        log(f"  minute {m}: rss {r['rss_mb']} MB, fds {r['fds']}, {r['requests']} req ({r['errors']} errors), "
            f"p99 TTFT {r['p99_ttft_ms']} ms")
    await asyncio.gather(*pending)
    return rows


def verdict(rows: list[Minute]) -> dict[str, Any]:
    first, last = rows[0], rows[-1]
    growth = (last.rss_mb - first.rss_mb) / first.rss_mb
    p99_first, p99_last = L.pct(first.ttft_ms, 99), L.pct(last.ttft_ms, 99)
    return {"rss_growth_pct": round(100 * growth, 2), "rss_ok": growth < 0.05,
            "fd_growth": last.fds - first.fds, "fds_ok": last.fds <= first.fds,
            "p99_ratio": round(p99_last / p99_first, 3), "p99_ok": p99_last <= 1.5 * p99_first,
            "errors": sum(r.errors for r in rows)}


def files(tmp: Path, ports: list[int]) -> tuple[Path, Path]:
    routes, policy = tmp / "routes.yaml", tmp / "policy.yaml"
    routes.write_text(L.routes_yaml({"t": [(f"t-{i}", f"http://127.0.0.1:{p}/v1") for i, p in enumerate(ports)]}))
    policy.write_text(L.policy_yaml("t", [{"name": "soak", "key": API_KEY}]))
    return routes, policy


async def run(args: argparse.Namespace, start: L.RunStart, tmp: Path, log: Any) -> dict[str, Any]:
    procs = start.procs
    ports = [L.free_port(), L.free_port()]
    for i, port in enumerate(ports):
        L.wait_http(f"http://127.0.0.1:{port}/health",
                    procs.start(f"emulator-{i}", L.emulator_argv(port, args.profile, seed=i + 1), None,
                                tmp / f"emulator-{i}.log"), f"emulator-{i}")
    with EmbeddedRedis() as redis:
        routes, policy = files(tmp, ports)
        gw_port = L.free_port()
        gw = procs.start("gateway", L.gateway_argv(routes, policy, gw_port, tmp / "requests.log", redis.url,
                                                   start.gw_cpu), None, tmp / "gateway.log")
        L.wait_gateway(gw_port, gw)
        gateway = psutil.Process(gw.pid)
        if gateway.name() == "taskset" or gateway.children():  # taskset execs, but be sure to sample python
            gateway = next((c for c in gateway.children(recursive=True)), gateway)
        url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as session:
            found = await capacity(session, url, args.max_tokens, log)
            rate = found["rps"] / 2
            log(f"capacity {found['rps']:.1f} req/s: soaking at {rate:.1f} req/s for {args.minutes} min")
            rows = await soak(session, url, rate, args.minutes, args.max_tokens, gateway, log)
        procs.check_alive()
    return {"capacity": found, "rate_rps": rate, "minutes": [r.row() for r in rows], "verdict": verdict(rows)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--profile", default="int4", help="emulator profile (int4 | int8 | fp16 | instant)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    args = parser.parse_args()
    start = L.begin(args.no_pin)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            result = uvloop.run(run(args, start, Path(tmp), lambda line: print(line, flush=True)))
    finally:
        start.procs.close()
    result.update(command=L.command_line(), machine=start.host, pinning=start.pin_note,
                  load_start=start.load_start, load_end=L.loadavg(),
                  wall_s=round(time.monotonic() - start.started, 1))
    table = L.md_table(list(result["minutes"][0]), [list(r.values()) for r in result["minutes"]])
    v = result["verdict"]
    summary = (f"RSS growth {v['rss_growth_pct']} % ({'ok' if v['rss_ok'] else 'FAIL'} < 5 %), "
               f"fd growth {v['fd_growth']} ({'ok' if v['fds_ok'] else 'FAIL'}), "
               f"p99 TTFT last/first {v['p99_ratio']} ({'ok' if v['p99_ok'] else 'FAIL'} <= 1.5), "
               f"{v['errors']} errors")
    markdown = "\n\n".join([f"`{result['command']}`", table, summary, L.load_line()])
    print(markdown)
    print(f"wrote {L.write_results('soak', stamp, result, markdown)}")
    return 0 if v["rss_ok"] and v["fds_ok"] and v["p99_ok"] and not v["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
