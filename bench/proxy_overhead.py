"""Proxy overhead of the gateway (issue 2): direct vs bare aiohttp proxy vs gateway, one emulator.

    .venv/bin/python bench/proxy_overhead.py [--quick] [--profile int4] [--strict]

Starts, on 127.0.0.1, one backend emulator (`gateway emulate`), the bare proxy (bench/bare_proxy.py)
and the gateway (`gateway serve`, request log to a temp file), then measures:

1. added TTFT (p50/p99 of proxy path minus the same percentile direct) for streaming chat requests
   at fixed concurrency 1, 32, 128 (closed loop; TTFT = first SSE event with non-empty delta.content);
2. CPU microseconds per non-streaming request in the proxy process (bare vs gateway);
3. CPU microseconds per forwarded SSE chunk: (cpu/req at long output - cpu/req at short output) /
   (content chunks/req long - short), so the per-request cost cancels out.

On a 2-core machine the proxy under test is pinned to one core, the emulator and this load
generator to the other. Results: a table on stdout, JSON + markdown under bench/results/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import importlib.metadata
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import psutil
import uvloop

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
API_KEY = "sk-demo"
TIER = "small-int4"
PROMPT = [{"role": "user", "content": "Say hello to the benchmark in a few words."}]
BUSY_WARN_CORES = 0.25  # other work at normal priority above this (in cores) makes the run suspect
ROUNDS = 4  # TTFT: each concurrency point is measured in this many interleaved slices per path
TARGETS = {"cpu_per_request_ratio": 2.5, "cpu_per_chunk_ratio": 1.5, "added_ttft_p50_ms_c32": 1.0}

# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    profile: str
    concurrencies: tuple[int, ...]
    ttft_requests: dict[int, int]  # measured requests per concurrency (per path)
    ttft_max_tokens: int
    think_steps: float  # pause before each request at concurrency > 1: uniform in [0, think_steps x step]
    cpu_reps: int
    req_n: int
    req_concurrency: int
    req_max_tokens: int
    chunk_concurrency: int
    chunk_short: int
    chunk_long: int
    point_time_limit_s: float


FULL = Settings(
    profile="int4", concurrencies=(1, 32, 128), ttft_requests={1: 300, 32: 2000, 128: 1000},
    ttft_max_tokens=4, think_steps=2.0, cpu_reps=5, req_n=1500, req_concurrency=32, req_max_tokens=4,
    chunk_concurrency=64, chunk_short=8, chunk_long=264, point_time_limit_s=40.0,
)
QUICK = Settings(
    profile="int4", concurrencies=(1, 32, 128), ttft_requests={1: 100, 32: 300, 128: 300},
    ttft_max_tokens=4, think_steps=2.0, cpu_reps=1, req_n=600, req_concurrency=32, req_max_tokens=4,
    chunk_concurrency=32, chunk_short=8, chunk_long=136, point_time_limit_s=20.0,
)

# --------------------------------------------------------------------------- processes

PR_SET_PDEATHSIG = 1


def _child_setup(cpus: set[int] | None) -> Any:
    def setup() -> None:
        with contextlib.suppress(Exception):  # die with the benchmark, even on SIGKILL
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


class Procs:
    """The processes this benchmark started; `close` ends each of them by its own handle."""

    def __init__(self) -> None:
        self.items: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], cpus: set[int] | None, log: Path,
              cwd: Path = ROOT) -> subprocess.Popen[bytes]:
        out = log.open("wb")
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=_child_setup(cpus), start_new_session=True)
        out.close()
        self.items.append((name, proc))
        return proc

    def check_alive(self) -> None:
        for name, proc in self.items:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}")

    def close(self) -> None:
        for _, proc in self.items:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.items:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.items.clear()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], name: str, method: str = "GET", timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
        try:
            req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
            with urllib.request.urlopen(req, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers HTTP: up
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer {url} within {timeout_s}s")


def cpu_seconds(pid: int) -> float:
    """CPU time of the process in seconds, to the nanosecond: the sum of its threads' on-CPU time from
    /proc/PID/task/*/schedstat (user + system). Falls back to psutil's utime + stime (10 ms ticks)."""
    total, found = 0, False
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(task.path, "schedstat").read_bytes().split()[0])
                found = True
    if found:
        return total / 1e9
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of the process and its live children (the gateway's embedded Redis server)."""
    total = cpu_seconds(pid)
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += cpu_seconds(child.pid)
    return total


def machine_cpu_seconds() -> tuple[float, float, float]:
    """(busy at normal priority, busy niced, steal) CPU seconds of the whole machine since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[2] + v[5] + v[6]) / hz, v[1] / hz, v[7] / hz


class OtherWork:
    """How busy the machine was with work other than this benchmark's processes, phase by phase:
    the numbers on a shared machine mean little without it."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.phases: dict[str, dict[str, float]] = {}

    def _now(self) -> tuple[float, float, float, float, float]:
        busy, niced, steal = machine_cpu_seconds()
        return time.perf_counter(), busy, niced, steal, sum(tree_cpu_seconds(p) for p in self.pids)

    @contextlib.contextmanager
    def phase(self, name: str, log: Any) -> Any:
        t0, b0, n0, s0, o0 = self._now()
        yield
        t1, b1, n1, s1, o1 = self._now()
        wall = t1 - t0
        found = {"wall_s": wall, "other_cores": max(0.0, (b1 - b0) - (o1 - o0)) / wall,
                 "niced_cores": (n1 - n0) / wall, "steal_cores": (s1 - s0) / wall, "bench_cores": (o1 - o0) / wall}
        self.phases[name] = found
        log(f"  [{name}: other work on the machine {found['other_cores']:.2f} cores busy (+ niced "
            f"{found['niced_cores']:.2f}), steal {found['steal_cores']:.2f}, this benchmark "
            f"{found['bench_cores']:.2f} cores]")


def tick_cpu_seconds(pid: int) -> float:
    """utime + stime from /proc/PID/stat (includes exited threads; 10 ms resolution): a cross-check."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


# --------------------------------------------------------------------------- load generator


@dataclass
class Path_:
    name: str
    url: str  # full URL of /v1/chat/completions
    model: str
    headers: dict[str, str]
    pid: int | None  # proxy process (None: direct)
    session: aiohttp.ClientSession | None = None
    sent: int = 0  # requests sent on this path (the gateway must log one line for each)


@dataclass
class Result:
    ok: bool
    ttft: float | None = None
    content_chunks: int = 0
    error: str | None = None


def body_bytes(path: Path_, max_tokens: int, stream: bool) -> bytes:
    return orjson.dumps({"model": path.model, "messages": PROMPT, "max_tokens": max_tokens,
                         "stream": stream, "ignore_eos": True})


async def one_request(path: Path_, body: bytes, stream: bool) -> Result:
    assert path.session is not None
    path.sent += 1
    t0 = time.perf_counter()
    try:
        async with path.session.post(path.url, data=body, headers=path.headers) as resp:
            if resp.status != 200:
                return Result(False, error=f"HTTP {resp.status}: {(await resp.read())[:200]!r}")
            if not stream:
                answer = orjson.loads(await resp.read())
                ok = bool(answer.get("choices"))
                return Result(ok, time.perf_counter() - t0, 0, None if ok else "no choices")
            ttft, chunks, done = None, 0, False
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if line.startswith(b"data: [DONE]"):
                    done = True
                    continue
                if ttft is None:
                    event = orjson.loads(line[6:])
                    choices = event.get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        ttft = time.perf_counter() - t0
                        chunks += 1
                    elif "error" in event:
                        return Result(False, error=str(event["error"])[:200])
                elif b'"delta":{"content":"' in line and b'"delta":{"content":""' not in line:
                    chunks += 1
                elif b'"error"' in line:
                    return Result(False, ttft, chunks, error=line[:200].decode(errors="replace"))
            if not done:
                return Result(False, ttft, chunks, "stream ended without [DONE]")
            return Result(ttft is not None, ttft, chunks, None if ttft is not None else "no content event")
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError) as err:
        return Result(False, error=f"{type(err).__name__}: {err}")


async def closed_loop(path: Path_, n: int, concurrency: int, max_tokens: int, stream: bool,
                      think_s: float, time_limit_s: float, seed: int = 0) -> tuple[list[Result], float, bool]:
    """`concurrency` workers send `n` requests back to back; returns results, wall seconds, truncated."""
    body = body_bytes(path, max_tokens, stream)
    todo = iter(range(n))
    results: list[Result] = []
    deadline = time.perf_counter() + time_limit_s
    truncated = False

    async def worker(i: int) -> None:
        nonlocal truncated
        rng = random.Random(seed * 100_003 + i)
        for _ in todo:
            if time.perf_counter() > deadline:
                truncated = True
                return
            if think_s:
                await asyncio.sleep(rng.uniform(0.0, think_s))
            results.append(await one_request(path, body, stream))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return results, time.perf_counter() - t0, truncated


def bootstrap_ci(a: list[float], b: list[float], reps: int = 1000) -> tuple[float, float]:
    """95 % bootstrap interval of median(a) - median(b)."""
    rng = np.random.default_rng(0)
    x, y = np.asarray(a), np.asarray(b)
    diffs = [float(np.median(rng.choice(x, x.size)) - np.median(rng.choice(y, y.size))) for _ in range(reps)]
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return float(lo), float(hi)


def errors_of(results: list[Result]) -> list[str]:
    return [r.error or "?" for r in results if not r.ok]


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# --------------------------------------------------------------------------- measurements


@dataclass
class TtftPoint:
    path: str
    concurrency: int
    n: int
    errors: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    wall_s: float
    rps: float
    proxy_core_util: float | None  # proxy CPU seconds / wall seconds during the point
    load_core_util: float  # (emulator + load generator) CPU seconds / wall seconds during the point
    think_max_ms: float
    truncated: bool
    error_samples: list[str] = field(default_factory=list)
    added_p50_ms: float | None = None  # this path's p50 minus direct's p50 (None for direct)
    added_p50_ci95_ms: tuple[float, float] | None = None  # bootstrap 95 % interval of added_p50_ms
    added_p99_ms: float | None = None
    ttft_ms: list[float] = field(default_factory=list, repr=False)  # the samples, in completion order


def step_s(profile: str, running: int, context_tokens: int) -> float:
    """The emulator's decode step time with `running` sequences (its own physics, read only)."""
    from gateway.emulator.profiles import get_profile

    p = get_profile(profile)
    return p.tpot_1_s * (1 + p.batch_slope * (running - 1)) + p.kv_read_s_per_token * running * context_tokens


async def measure_ttft(paths: list[Path_], s: Settings, emu_pid: int, log: Any) -> list[TtftPoint]:
    """The emulator emits tokens in batched steps; a request that arrives mid-step waits for the next
    one. Closed-loop clients all finish on the same step and would re-arrive at the same phase of the
    step (the proxy's forward latency then hides inside that wait), so at concurrency > 1 each client
    pauses uniform [0, 2 steps] before sending: arrival phases become uniform for every path."""
    points: list[TtftPoint] = []
    me = os.getpid()
    for c in s.concurrencies:
        n = s.ttft_requests[c]
        think = s.think_steps * step_s(s.profile, c, 32 + s.ttft_max_tokens) if c > 1 else 0.0
        samples: dict[str, list[Result]] = {p.name: [] for p in paths}
        walls: dict[str, float] = {p.name: 0.0 for p in paths}
        cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        load_cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        trunc: dict[str, bool] = {p.name: False for p in paths}
        for p in paths:  # warm-up: connection pools at this concurrency, caches
            await closed_loop(p, max(2 * c, 20), c, s.ttft_max_tokens, True, think, s.point_time_limit_s / 4)
        # ROUNDS slices, each path in turn, the order reversed every round, so that drift and
        # bursts of other work on a shared machine hit every path alike
        for rnd in range(ROUNDS):
            for p in paths if rnd % 2 == 0 else paths[::-1]:
                cpu0 = cpu_seconds(p.pid) if p.pid else 0.0
                load0 = cpu_seconds(emu_pid) + cpu_seconds(me)
                res, wall, tr = await closed_loop(p, n // ROUNDS, c, s.ttft_max_tokens, True, think,
                                                  s.point_time_limit_s / ROUNDS, seed=rnd)
                load_cpu[p.name] += cpu_seconds(emu_pid) + cpu_seconds(me) - load0
                if p.pid:
                    cpu[p.name] += cpu_seconds(p.pid) - cpu0
                samples[p.name] += res
                walls[p.name] += wall
                trunc[p.name] |= tr
        for p in paths:
            res = samples[p.name]
            ttfts = [r.ttft * 1000 for r in res if r.ok and r.ttft is not None]
            errs = errors_of(res)
            nan = float("nan")
            point = TtftPoint(
                p.name, c, len(ttfts), len(errs),
                pct(ttfts, 50) if ttfts else nan, pct(ttfts, 90) if ttfts else nan,
                pct(ttfts, 99) if ttfts else nan, statistics.fmean(ttfts) if ttfts else nan,
                walls[p.name], len(res) / walls[p.name] if walls[p.name] else 0.0,
                cpu[p.name] / walls[p.name] if p.pid and walls[p.name] else None,
                load_cpu[p.name] / walls[p.name] if walls[p.name] else 0.0, 1000 * think, trunc[p.name], errs[:3],
                ttft_ms=[round(x, 4) for x in ttfts],
            )
            if p.pid is not None and ttfts:
                direct = next(t for t in points if t.path == "direct" and t.concurrency == c)
                if direct.ttft_ms:
                    point.added_p50_ms = point.p50_ms - direct.p50_ms
                    point.added_p99_ms = point.p99_ms - direct.p99_ms
                    point.added_p50_ci95_ms = bootstrap_ci(point.ttft_ms, direct.ttft_ms)
            points.append(point)
            log(f"  ttft c={c:<4} {p.name:<8} n={point.n:<5} err={point.errors:<3} p50={point.p50_ms:8.3f} ms "
                f"p99={point.p99_ms:8.3f} ms  {point.rps:7.1f} req/s"
                + f"  load core {100 * point.load_core_util:.0f}%"
                + (f"  proxy core {100 * point.proxy_core_util:.0f}%" if point.proxy_core_util is not None else "")
                + ("  TRUNCATED (time limit)" if point.truncated else ""))
    return points


@dataclass
class CpuRun:
    path: str
    kind: str  # "request" | "stream_short" | "stream_long"
    n: int
    errors: int
    cpu_s: float
    tick_cpu_s: float  # the same from /proc/PID/stat (10 ms ticks, includes exited threads)
    tree_cpu_s: float  # the process and its children (the gateway's embedded Redis server)
    threads: int
    wall_s: float
    content_chunks_per_req: float


async def cpu_batch(p: Path_, kind: str, n: int, c: int, max_tokens: int, stream: bool,
                    limit_s: float) -> CpuRun:
    assert p.pid is not None
    await closed_loop(p, max(c, 20), c, min(max_tokens, 8), stream, 0.0, limit_s / 4)  # warm the pools
    await asyncio.sleep(0.2)
    cpu0, tick0, tree0 = cpu_seconds(p.pid), tick_cpu_seconds(p.pid), tree_cpu_seconds(p.pid)
    res, wall, _ = await closed_loop(p, n, c, max_tokens, stream, 0.0, limit_s)
    cpu, tick, tree = cpu_seconds(p.pid) - cpu0, tick_cpu_seconds(p.pid) - tick0, tree_cpu_seconds(p.pid) - tree0
    ok = [r for r in res if r.ok]
    chunks = statistics.fmean(r.content_chunks for r in ok) if ok else 0.0
    threads = psutil.Process(p.pid).num_threads()
    return CpuRun(p.name, kind, len(res), len(res) - len(ok), cpu, tick, tree, threads, wall, chunks)


async def measure_cpu(proxies: list[Path_], s: Settings, log: Any) -> list[CpuRun]:
    runs: list[CpuRun] = []
    for rep in range(s.cpu_reps):
        for p in proxies if rep % 2 == 0 else proxies[::-1]:
            r = await cpu_batch(p, "request", s.req_n, s.req_concurrency, s.req_max_tokens, False,
                                s.point_time_limit_s)
            runs.append(r)
            log(f"  cpu/request  rep {rep + 1} {p.name:<8} n={r.n} err={r.errors} "
                f"{1e6 * r.cpu_s / max(r.n, 1):8.1f} us/req  ({r.wall_s:.1f} s; with child processes "
                f"{1e6 * r.tree_cpu_s / max(r.n, 1):.1f} us/req)")
            short = await cpu_batch(p, "stream_short", 2 * s.chunk_concurrency, s.chunk_concurrency, s.chunk_short,
                                    True, s.point_time_limit_s)
            long = await cpu_batch(p, "stream_long", s.chunk_concurrency, s.chunk_concurrency, s.chunk_long,
                                   True, s.point_time_limit_s)
            runs += [short, long]
            log(f"  cpu/chunk    rep {rep + 1} {p.name:<8} {per_chunk_us(short, long):8.2f} us/chunk  "
                f"(short {short.content_chunks_per_req:.0f} ch {1e6 * short.cpu_s / max(short.n, 1):.0f} us/req, "
                f"long {long.content_chunks_per_req:.0f} ch {1e6 * long.cpu_s / max(long.n, 1):.0f} us/req, "
                f"{long.wall_s:.1f} s, err {short.errors + long.errors})")
    return runs


def per_chunk_us(short: CpuRun, long: CpuRun, tree: bool = False) -> float:
    d = long.content_chunks_per_req - short.content_chunks_per_req
    if d <= 0 or not short.n or not long.n:
        return float("nan")
    if tree:
        return 1e6 * (long.tree_cpu_s / long.n - short.tree_cpu_s / short.n) / d
    return 1e6 * (long.cpu_s / long.n - short.cpu_s / short.n) / d


def cpu_summary(runs: list[CpuRun], name: str) -> dict[str, Any]:
    req = [1e6 * r.cpu_s / r.n for r in runs if r.path == name and r.kind == "request" and r.n]
    shorts = [r for r in runs if r.path == name and r.kind == "stream_short"]
    longs = [r for r in runs if r.path == name and r.kind == "stream_long"]
    chunk = [per_chunk_us(a, b) for a, b in zip(shorts, longs)]
    req_tree = [1e6 * r.tree_cpu_s / r.n for r in runs if r.path == name and r.kind == "request" and r.n]
    chunk_tree = [per_chunk_us(a, b, tree=True) for a, b in zip(shorts, longs)]
    return {"cpu_us_per_request": statistics.median(req), "cpu_us_per_request_reps": req,
            "cpu_us_per_chunk": statistics.median(chunk), "cpu_us_per_chunk_reps": chunk,
            "with_children_cpu_us_per_request": statistics.median(req_tree),
            "with_children_cpu_us_per_chunk": statistics.median(chunk_tree)}


async def idle_cpu(proxies: list[Path_], seconds: float) -> dict[str, float]:
    before = {p.name: cpu_seconds(p.pid) for p in proxies if p.pid}
    await asyncio.sleep(seconds)
    return {p.name: 1e3 * (cpu_seconds(p.pid) - before[p.name]) / seconds for p in proxies if p.pid}


async def smoke(paths: list[Path_]) -> None:
    """One streaming and one non-streaming request per path; refuse to measure a broken path."""
    for p in paths:
        r = await one_request(p, body_bytes(p, 5, True), True)
        if not r.ok or r.content_chunks != 5:
            raise RuntimeError(f"smoke test failed on {p.name} (stream, 5 tokens): {r}")
        r = await one_request(p, body_bytes(p, 5, False), False)
        if not r.ok:
            raise RuntimeError(f"smoke test failed on {p.name} (non-stream): {r}")


# --------------------------------------------------------------------------- py-spy


def _where(frame: str) -> str:
    return frame.partition(" (")[2].removesuffix(")")


def _frame_key(frame: str) -> str:
    """'serve (gateway/http.py:49)' -> 'serve (gateway/http.py)'."""
    name, where = frame.partition(" (")[0], _where(frame)
    return f"{name} ({where.split(':', 1)[0]})" if where else name


def _area(frame: str) -> str:
    """The package a leaf frame belongs to; native frames (py-spy --native) by library."""
    where = _where(frame).split(":", 1)[0]
    if where.startswith("libc.so") or where.startswith("libpthread"):
        return "libc (syscalls: read/write/epoll...)"
    if where.startswith("libpython") or where.endswith((".c", ".h")) or ".so" in where:
        return "C (CPython, uvloop, extensions)"
    if where.startswith(("<", "_weakrefset", "enum", "typing", "functools", "contextlib", "dataclasses")):
        return "python stdlib/generated"
    return where.split("/", 1)[0] or "other"


# With --native, py-spy counts threads blocked in these calls as active: sleeping helper threads
# (watchfiles' notify thread, idle executor workers), not CPU. Their samples are dropped.
BLOCKED = ("clock_nanosleep", "pthread_cond_timedwait", "pthread_cond_wait", "PyThread_acquire_lock_timed",
           "Condition.wait", "sem_timedwait", "sem_wait")


def summarize_pyspy(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function, and self share per package, from py-spy's
    collapsed-stack output (idle samples excluded, so samples are proportional to CPU time)."""
    self_: dict[str, int] = {}
    incl: dict[str, int] = {}
    areas: dict[str, int] = {}
    total = blocked = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        if any(b in stack for b in BLOCKED):
            blocked += n
            continue
        total += n
        leaf = frames[-1]
        self_[_frame_key(leaf)] = self_.get(_frame_key(leaf), 0) + n
        areas[_area(leaf)] = areas.get(_area(leaf), 0) + n
        for key in {_frame_key(f) for f in frames}:
            incl[key] = incl.get(key, 0) + n

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])]

    # the gateway's own functions, without the entry point frames that hold every sample
    inclusive = [(k, v) for k, v in share(incl) if "(gateway/" in k and v < 99][:top]
    return {"samples": total, "blocked_samples_dropped": blocked, "self_pct": share(self_)[:top],
            "inclusive_pct": inclusive,
            "self_pct_by_package": share(areas)}


async def pyspy_profile(p: Path_, s: Settings, out: Path, stamp: str, log: Any) -> dict[str, Any]:
    """Record the proxy with py-spy (1 kHz, with native frames) during a non-streaming batch and a
    long-streaming batch, each twice the measured size; these batches are not part of the measurements."""
    exe = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if exe is None:
        log("py-spy not found: .venv/bin/pip install py-spy")
        return {}
    assert p.pid is not None
    found: dict[str, Any] = {}
    batches = {"request": (s.req_n, s.req_concurrency, s.req_max_tokens, False),
               "stream_long": (s.chunk_concurrency, s.chunk_concurrency, s.chunk_long, True)}
    for kind, (n, c, max_tokens, stream) in batches.items():
        raw = out / f"pyspy-{stamp}-{p.name}-{kind}.txt"
        await closed_loop(p, max(c, 20), c, min(max_tokens, 8), stream, 0.0, s.point_time_limit_s / 4)
        spy = subprocess.Popen([exe, "record", "--pid", str(p.pid), "--rate", "1000", "--format", "raw", "--native",
                                "--output", str(raw), "--duration", str(int(s.point_time_limit_s) + 10)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            await asyncio.sleep(1.0)  # let it attach
            await closed_loop(p, 2 * n, c, max_tokens, stream, 0.0, s.point_time_limit_s)
            spy.send_signal(signal.SIGINT)
            _, err = spy.communicate(timeout=15)
        finally:
            if spy.poll() is None:
                spy.kill()
                spy.wait(timeout=5)
        if not raw.exists():
            log(f"py-spy wrote nothing for {p.name}/{kind}: {err.decode(errors='replace')[-300:]}")
            continue
        summary = found[kind] = {**summarize_pyspy(raw), "raw": str(raw)}
        log(f"\npy-spy {p.name} {kind} batch ({summary['samples']} samples, {summary['blocked_samples_dropped']} "
            f"of sleeping threads dropped; raw stacks: {raw.name})")
        log("  self time by package: " + ", ".join(f"{k} {v}%" for k, v in summary["self_pct_by_package"][:8]))
        log("  top self time:")
        for k, v in summary["self_pct"]:
            log(f"    {v:5.1f}%  {k}")
        log("  top inclusive time (gateway functions, including what they call):")
        for k, v in summary["inclusive_pct"]:
            log(f"    {v:5.1f}%  {k}")
    return found


# --------------------------------------------------------------------------- report


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gateway", "policies"], cwd=ROOT,
                           capture_output=True, text=True)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "nproc": os.cpu_count(),
        "cpu_model": model, "python": platform.python_version(), "aiohttp": aiohttp.__version__,
        "uvloop": importlib.metadata.version("uvloop"), "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
        "git_commit": commit.stdout.strip() or None, "gateway_dirty": bool(dirty.stdout.strip()),
        "gateway_uncommitted": dirty.stdout.split("\n")[:20],
    }


def render(result: dict[str, Any]) -> tuple[str, str]:
    """(terminal table, markdown) from the result dict."""
    ttft = {(t["path"], t["concurrency"]): t for t in result["ttft"]}
    cpu, checks = result["cpu"], result["checks"]
    rows: list[list[str]] = []
    for c in result["settings"]["concurrencies"] if ttft else ():
        d = ttft[("direct", c)]
        for name in ("bare", "gateway"):
            t = ttft[(name, c)]
            util = f"{100 * t['proxy_core_util']:.0f}%" if t["proxy_core_util"] is not None else "-"
            lo, hi = t["added_p50_ci95_ms"] or (float("nan"), float("nan"))
            rows.append([f"added TTFT c={c}", name, f"{t['added_p50_ms']:+.3f} ms [{lo:+.2f}, {hi:+.2f}]",
                         f"{t['added_p99_ms']:+.3f} ms",
                         f"direct p50 {d['p50_ms']:.2f} / p99 {d['p99_ms']:.2f} ms; n={t['n']}, "
                         f"err={t['errors']}, {t['rps']:.0f} req/s, proxy core {util}, "
                         f"load core {100 * t['load_core_util']:.0f}%"])
    if cpu:
        b, g, reps = cpu["bare"], cpu["gateway"], result["settings"]["cpu_reps"]
        rows.append(["CPU per request (non-stream)", "bare | gateway", f"{b['cpu_us_per_request']:.0f} us",
                     f"{g['cpu_us_per_request']:.0f} us",
                     f"ratio {checks['cpu_per_request_ratio']['value']:.2f}x; median of {reps}"])
        rows.append(["CPU per SSE chunk", "bare | gateway", f"{b['cpu_us_per_chunk']:.2f} us",
                     f"{g['cpu_us_per_chunk']:.2f} us",
                     f"ratio {checks['cpu_per_chunk_ratio']['value']:.2f}x; median of {reps}"])
        if "with_children_cpu_us_per_request" in g:
            rows.append(["CPU incl. child processes (Redis)", "bare | gateway",
                         f"{b['with_children_cpu_us_per_request']:.0f} us/req",
                         f"{g['with_children_cpu_us_per_request']:.0f} us/req",
                         f"per chunk {b['with_children_cpu_us_per_chunk']:.2f} | "
                         f"{g['with_children_cpu_us_per_chunk']:.2f} us; not in the targets"])
    head = ["measure", "path", "p50 [95% CI] / bare", "p99 / gateway", "notes"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join
    term = [line(h.ljust(w) for h, w in zip(head, widths)), line("-" * w for w in widths)]
    term += [line(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    term.append("")
    for name, chk in checks.items():
        note = f"  ({chk['note']})" if chk.get("note") else ""
        verdict = "PASS" if chk["pass"] else "FAIL"
        term.append(f"{verdict}  {name}: {chk['value']:.3f} (target <= {chk['target']}){note}")
    busy = "; ".join(f"{name} phase {w['other_cores']:.2f} cores (+ niced {w.get('niced_cores', 0):.2f}, "
                     f"steal {w['steal_cores']:.2f})" for name, w in result.get("other_work", {}).items())
    warn = ""
    if busy:
        term.append(f"other work on the machine meanwhile: {busy}")
        if any(w["other_cores"] > BUSY_WARN_CORES for w in result["other_work"].values()):
            warn = (f"WARNING: other work used more than {BUSY_WARN_CORES} cores during a phase: "
                    "the numbers above are disturbed; run again on a quiet machine")
            term.append(warn)
    md = ["| measure | path | p50 [95% CI] (or bare) | p99 (or gateway) | notes |", "| --- | --- | --- | --- | --- |"]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    md += ["", "| target | value | limit | result |", "| --- | --- | --- | --- |"]
    md += [f"| {n} | {c['value']:.3f} | <= {c['target']} | {'PASS' if c['pass'] else 'FAIL'}"
           f"{' (' + c['note'] + ')' if c.get('note') else ''} |" for n, c in checks.items()]
    if busy:
        md += ["", f"Other work on the machine meanwhile: {busy}." + (f" **{warn}**" if warn else "")]
    return "\n".join(term), "\n".join(md)


def summarize(files: list[Path]) -> str:
    """One markdown row per result file: the key numbers, to compare runs (`--summarize FILE...`)."""
    rows = ["| run (UTC) | gateway | mode | other work (cores) | added p50 c=32 bare / gateway "
            "| CPU/req bare / gateway | CPU/chunk bare / gateway |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in files:
        r = json.loads(f.read_text())
        if r.get("benchmark") != "proxy_overhead":
            continue
        tt = {(t["path"], t["concurrency"]): t for t in r.get("ttft", [])}
        cpu, s = r.get("cpu", {}), r["settings"]
        other = r.get("other_work", {})
        busy = " / ".join(f"{w['other_cores']:.2f}" + (f" (+{w['niced_cores']:.2f} niced)" if w.get("niced_cores")
                                                         else "") for w in other.values()) or "not recorded"
        d32 = tt[("direct", 32)]["p50_ms"] if ("direct", 32) in tt else 0.0
        ttft = (f"{tt[('bare', 32)]['p50_ms'] - d32:+.2f} / {tt[('gateway', 32)]['p50_ms'] - d32:+.2f} ms"
                if ("gateway", 32) in tt else "-")
        req = (f"{cpu['bare']['cpu_us_per_request']:.0f} / {cpu['gateway']['cpu_us_per_request']:.0f} us "
               f"({cpu['gateway']['cpu_us_per_request'] / cpu['bare']['cpu_us_per_request']:.2f}x)" if cpu else "-")
        chunk = (f"{cpu['bare']['cpu_us_per_chunk']:.1f} / {cpu['gateway']['cpu_us_per_chunk']:.1f} us "
                 f"({cpu['gateway']['cpu_us_per_chunk'] / cpu['bare']['cpu_us_per_chunk']:.2f}x)" if cpu else "-")
        mode = f"{s['profile']}, {s['cpu_reps']} reps, {s['ttft_requests'].get('32', '-')} req @32"
        m = r["machine"]
        gw = f"{m['git_commit']}{'+' if m.get('gateway_dirty') else ''}"
        if m.get("gateway_src"):
            gw = f"from {m['gateway_src']}"
        rows.append(f"| {m['date']} | {gw} | {mode} | {busy} | {ttft} | {req} | {chunk} |")
    return "\n".join(rows)


def header_of(result: dict[str, Any]) -> str:
    m = result["machine"]
    mode = result.get("mode") or ("quick" if result["settings"]["cpu_reps"] == 1 else "full") + (
        "" if result.get("ttft") and result.get("cpu") else " (ttft only)" if result.get("ttft") else " (cpu only)")
    gateway = f"gateway from {m['gateway_src']}" if m.get("gateway_src") else f"gateway@{m['git_commit']}"
    return (f"{m['date']}  {m['nproc']} x {m['cpu_model']}  profile={result['settings']['profile']}  "
            f"{mode} run  {result.get('elapsed_s', '?')} s  "
            f"pinned={'yes' if result['pinned'] else 'no'}  {gateway}{' (dirty)' if m['gateway_dirty'] else ''}")


# --------------------------------------------------------------------------- main


async def run_bench(args: argparse.Namespace, s: Settings, procs: Procs, tmp: Path, log: Any) -> dict[str, Any]:
    host = machine()  # before anything starts: the gateway code this run measures
    host["gateway_src"] = str(args.gateway_src.resolve()) if args.gateway_src else None
    allowed = sorted(os.sched_getaffinity(0))
    pin = len(allowed) >= 2 and not args.no_pin
    load_cpus, proxy_cpus = ({allowed[0]}, {allowed[1]}) if pin else (None, None)
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
        log(f"pinning: proxy under test -> CPU {allowed[1]}; emulator + load generator -> CPU {allowed[0]}")
    else:
        log("pinning: OFF (" + ("--no-pin" if args.no_pin else f"only {len(allowed)} CPU allowed") + ")")

    emu_port, bare_port, gw_port = free_port(), free_port(), free_port()
    # the gateway watches the routes file's folder for hot reload: keep the busy request log elsewhere
    (tmp / "config").mkdir()
    routes = tmp / "config" / "routes.yaml"
    routes.write_text(
        "tiers:\n  - name: small-int4\n    precision: int4\n    context_window: 8192\n"
        "    prices: {input_per_mtok: 0.05, output_per_mtok: 0.20}\n    replicas:\n"
        f'      - {{name: small-int4-a, url: "http://127.0.0.1:{emu_port}/v1", model: emulated}}\n'
    )
    gw_log = tmp / "gateway-requests.log"
    py = sys.executable
    emu = procs.start("emulator", [py, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", str(emu_port),
                                   "--profile", s.profile, "--seed", "1"], load_cpus, tmp / "emulator.out")
    bare = procs.start("bare proxy", [py, str(ROOT / "bench" / "bare_proxy.py"), "--port", str(bare_port),
                                      "--upstream", f"http://127.0.0.1:{emu_port}"], proxy_cpus, tmp / "bare.out")
    src = args.gateway_src.resolve() if args.gateway_src else ROOT  # `python -m gateway` imports from its cwd
    policy = next(p for p in (src / "policies" / "emulator.yaml", ROOT / "policies" / "emulator.yaml") if p.exists())
    gw = procs.start("gateway", [py, "-m", "gateway", "serve", "--routes", str(routes), "--policies",
                                 str(policy), "--host", "127.0.0.1", "--port",
                                 str(gw_port), "--log-file", str(gw_log)], proxy_cpus, tmp / "gateway.out", cwd=src)
    wait_http(f"http://127.0.0.1:{emu_port}/health", emu, "emulator")
    wait_http(f"http://127.0.0.1:{bare_port}/v1/chat/completions", bare, "bare proxy", "POST")
    wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw, "gateway")

    auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    plain = {"Content-Type": "application/json"}
    paths = [
        Path_("direct", f"http://127.0.0.1:{emu_port}/v1/chat/completions", "emulated", plain, None),
        Path_("bare", f"http://127.0.0.1:{bare_port}/v1/chat/completions", "emulated", plain, bare.pid),
        Path_("gateway", f"http://127.0.0.1:{gw_port}/v1/chat/completions", TIER, auth, gw.pid),
    ]
    timeout = aiohttp.ClientTimeout(total=120, sock_read=30)
    async with contextlib.AsyncExitStack() as stack:
        for p in paths:
            p.session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout, auto_decompress=False))
        await smoke(paths)
        log("smoke test ok on direct, bare, gateway")
        idle = await idle_cpu(paths[1:], 1.0)
        log(f"idle CPU: " + ", ".join(f"{k} {v:.2f} ms/s" for k, v in idle.items()))
        ttft: list[TtftPoint] = []
        runs: list[CpuRun] = []
        other = OtherWork([os.getpid(), emu.pid, bare.pid, gw.pid])
        if args.only in (None, "ttft"):
            log("TTFT (streaming chat, ignore_eos, max_tokens=%d):" % s.ttft_max_tokens)
            with other.phase("ttft", log):
                ttft = await measure_ttft(paths, s, emu.pid, log)
            procs.check_alive()
        if args.only in (None, "cpu"):
            log("CPU in the proxy process (median of %d reps):" % s.cpu_reps)
            with other.phase("cpu", log):
                runs = await measure_cpu(paths[1:], s, log)
            procs.check_alive()
        profiles: dict[str, Any] = {}
        if args.py_spy:
            args.out.mkdir(parents=True, exist_ok=True)
            for p in paths[1:] if args.py_spy == "both" else paths[2:]:
                profiles[p.name] = await pyspy_profile(p, s, args.out, args.stamp, log)

    gw_lines = sum(1 for _ in gw_log.open("rb")) if gw_log.exists() else 0
    if gw_lines != paths[2].sent:
        log(f"WARNING: the gateway logged {gw_lines} request lines for {paths[2].sent} requests sent")
    cpu = {name: cpu_summary(runs, name) for name in ("bare", "gateway")} if runs else {}
    tt = {(t.path, t.concurrency): t for t in ttft}
    values: dict[str, float] = {}
    if cpu:
        values["cpu_per_request_ratio"] = cpu["gateway"]["cpu_us_per_request"] / cpu["bare"]["cpu_us_per_request"]
        values["cpu_per_chunk_ratio"] = cpu["gateway"]["cpu_us_per_chunk"] / cpu["bare"]["cpu_us_per_chunk"]
    if ("gateway", 32) in tt:
        values["added_ttft_p50_ms_c32"] = tt[("gateway", 32)].p50_ms - tt[("direct", 32)].p50_ms
    checks: dict[str, dict[str, Any]] = {
        k: {"value": v, "target": TARGETS[k], "pass": bool(v <= TARGETS[k])} for k, v in values.items()
    }
    if "added_ttft_p50_ms_c32" in checks and tt[("gateway", 32)].added_p50_ci95_ms:
        lo, hi = tt[("gateway", 32)].added_p50_ci95_ms or (0.0, 0.0)
        chk = checks["added_ttft_p50_ms_c32"]
        chk["ci95"] = [lo, hi]
        if (lo <= chk["target"]) != (hi <= chk["target"]):
            chk["note"] = f"inconclusive: 95% CI [{lo:+.2f}, {hi:+.2f}] ms straddles the target"
    return {
        "benchmark": "proxy_overhead", "machine": host, "settings": asdict(s), "pinned": pin,
        "other_work": other.phases,
        "pinning": {"proxy_cpus": sorted(proxy_cpus or []), "emulator_and_loadgen_cpus": sorted(load_cpus or [])},
        "idle_cpu_ms_per_s": idle, "ttft": [asdict(t) for t in ttft], "cpu_runs": [asdict(r) for r in runs],
        "cpu": cpu, "checks": checks, "py_spy": profiles,
        "gateway_log_lines": gw_lines, "gateway_requests_sent": paths[2].sent,
    }


def print_tails(folder: Path, names: Sequence[str], lines: int = 20) -> None:
    """After a failure: the last lines each child process wrote, to stderr."""
    for name in names:
        f = folder / name
        if f.exists() and f.stat().st_size:
            print(f"--- {name} (last lines) ---\n" + "\n".join(f.read_text().splitlines()[-lines:]), file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, one CPU repetition")
    parser.add_argument("--profile", help="emulator profile (default int4: small but non-zero TTFT/TPOT)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--only", choices=("ttft", "cpu"), help="run one half of the benchmark")
    parser.add_argument("--py-spy", nargs="?", const="gateway", choices=("gateway", "both"),
                        help="afterwards, profile the gateway (or both proxies) with py-spy; prints top functions")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON/markdown results")
    parser.add_argument("--gateway-src", type=Path, metavar="DIR",
                        help="run the gateway from another checkout (e.g. `git worktree add /tmp/gw-old HEAD~3`), "
                             "for before/after comparisons; the emulator stays this checkout's")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="print the header and markdown tables of an earlier result file, and exit")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                        help="print a markdown table of the key numbers of earlier result files, and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if args.render:
        earlier = json.loads(args.render.read_text())
        print(header_of(earlier) + "\n\n" + render(earlier)[1])
        return 0
    args.stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    s = QUICK if args.quick else FULL
    if args.profile:
        s = Settings(**{**asdict(s), "profile": args.profile})

    def log(msg: str) -> None:
        print(msg, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    procs = Procs()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmpdir:
            try:
                result = uvloop.run(run_bench(args, s, procs, Path(tmpdir), log))
            except Exception:
                print_tails(Path(tmpdir), ("emulator.out", "bare.out", "gateway.out"))
                raise
            finally:
                procs.close()
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped", file=sys.stderr)
        return 130
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["mode"] = ("quick" if args.quick else "full") + (f" ({args.only} only)" if args.only else "")
    term, md = render(result)
    header = header_of(result)
    print("\n" + header + "\n" + term)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = args.stamp
    json_path = args.out / f"proxy_overhead-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=2, default=str))
    (args.out / f"proxy_overhead-{stamp}.md").write_text(header + "\n\n" + md + "\n")
    print(f"\nresults: {json_path.relative_to(ROOT) if json_path.is_relative_to(ROOT) else json_path} (+ .md)")
    failed = [k for k, c in result["checks"].items() if not c["pass"]]
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
