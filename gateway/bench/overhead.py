"""Proxy overhead (bench/proxy_overhead.py, issue 2): direct vs bare aiohttp proxy vs gateway, one emulator.

1. added TTFT (p50/p99 of a proxy path minus the same percentile direct) for streaming chat requests
   at fixed concurrencies (closed loop; TTFT = first SSE event with non-empty delta.content);
2. CPU microseconds per non-streaming request in the proxy process (bare vs gateway);
3. CPU microseconds per forwarded SSE chunk: (cpu/req at long output - cpu/req at short output) /
   (content chunks/req long - short), so the per-request cost cancels out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import psutil

from gateway.bench.client import RequestResult, send, send_json
from gateway.bench.cpu import CpuProbe, Log, OtherWork, cpu_seconds, tick_cpu_seconds, tree_cpu_seconds
from gateway.bench.procs import Procs, bare_proxy_argv, emulator_argv, free_ports, pinning, wait_http
from gateway.bench.pyspy import executable, record, summarize_pyspy
from gateway.bench.report import ROOT, machine
from gateway.bench.runner import RunResult, closed_loop
from gateway.bench.summary import percentile
from gateway.emulator.profiles import get_profile

API_KEY = "sk-demo"
TIER = "small-int4"
PROMPT = [{"role": "user", "content": "Say hello to the benchmark in a few words."}]
BUSY_WARN_CORES = 0.25  # other work at normal priority above this (in cores) makes the run suspect
ROUNDS = 4  # TTFT: each concurrency point is measured in this many interleaved slices per path
TARGETS = {"cpu_per_request_ratio": 2.5, "cpu_per_chunk_ratio": 1.5, "added_ttft_p50_ms_c32": 1.0}


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


# --------------------------------------------------------------------------- load


@dataclass
class ProxyPath:
    name: str
    url: str  # full URL of /v1/chat/completions
    model: str
    headers: dict[str, str]
    pid: int | None  # proxy process (None: direct)
    session: aiohttp.ClientSession | None = None
    sent: int = 0  # requests sent on this path (the gateway must log one line for each)


def body_bytes(path: ProxyPath, max_tokens: int, stream: bool) -> bytes:
    return orjson.dumps({"model": path.model, "messages": PROMPT, "max_tokens": max_tokens,
                         "stream": stream, "ignore_eos": True})


async def one_request(path: ProxyPath, body: bytes, stream: bool) -> RequestResult:
    assert path.session is not None
    path.sent += 1
    return await (send if stream else send_json)(path.session, path.url, body, path.headers)


async def load(path: ProxyPath, n: int, concurrency: int, max_tokens: int, stream: bool, think_s: float,
               time_limit_s: float, seed: int = 0) -> RunResult:
    """`concurrency` workers send `n` requests back to back (after a think time uniform in [0, think_s])."""
    body = body_bytes(path, max_tokens, stream)

    async def sender(i: int) -> RequestResult:
        return await one_request(path, body, stream)

    return await closed_loop(sender, n, concurrency, duration_s=time_limit_s, think_s=think_s, seed=seed)


def bootstrap_ci(a: list[float], b: list[float], reps: int = 1000) -> tuple[float, float]:
    """95 % bootstrap interval of median(a) - median(b)."""
    rng = np.random.default_rng(0)
    x, y = np.asarray(a), np.asarray(b)
    diffs = [float(np.median(rng.choice(x, x.size)) - np.median(rng.choice(y, y.size))) for _ in range(reps)]
    return percentile(diffs, 2.5), percentile(diffs, 97.5)


def errors_of(results: list[RequestResult]) -> list[str]:
    return [r.error or "?" for r in results if not r.ok]


# --------------------------------------------------------------------------- TTFT


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
    p = get_profile(profile)
    return p.tpot_1_s * (1 + p.batch_slope * (running - 1)) + p.kv_read_s_per_token * running * context_tokens


async def measure_ttft(paths: list[ProxyPath], s: Settings, emu_pid: int, log: Log) -> list[TtftPoint]:
    """The emulator emits tokens in batched steps; a request that arrives mid-step waits for the next
    one. Closed-loop clients all finish on the same step and would re-arrive at the same phase of the
    step (the proxy's forward latency then hides inside that wait), so at concurrency > 1 each client
    pauses uniform [0, 2 steps] before sending: arrival phases become uniform for every path."""
    points: list[TtftPoint] = []
    me = os.getpid()
    for c in s.concurrencies:
        n = s.ttft_requests[c]
        think = s.think_steps * step_s(s.profile, c, 32 + s.ttft_max_tokens) if c > 1 else 0.0
        samples: dict[str, list[RequestResult]] = {p.name: [] for p in paths}
        walls: dict[str, float] = {p.name: 0.0 for p in paths}
        cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        load_cpu: dict[str, float] = {p.name: 0.0 for p in paths}
        trunc: dict[str, bool] = {p.name: False for p in paths}
        for p in paths:  # warm-up: connection pools at this concurrency, caches
            await load(p, max(2 * c, 20), c, s.ttft_max_tokens, True, think, s.point_time_limit_s / 4)
        # ROUNDS slices, each path in turn, the order reversed every round, so that drift and
        # bursts of other work on a shared machine hit every path alike
        for rnd in range(ROUNDS):
            for p in paths if rnd % 2 == 0 else paths[::-1]:
                with CpuProbe({"proxy": p.pid, "load": [emu_pid, me]}).measure() as used:
                    run = await load(p, n // ROUNDS, c, s.ttft_max_tokens, True, think,
                                     s.point_time_limit_s / ROUNDS, seed=rnd)
                load_cpu[p.name] += used["load"]
                cpu[p.name] += used["proxy"]
                samples[p.name] += run.results
                walls[p.name] += run.duration_s
                trunc[p.name] |= run.truncated
        for p in paths:
            res = samples[p.name]
            ttfts = [r.ttft_s * 1000 for r in res if r.ok and r.ttft_s is not None]
            errs = errors_of(res)
            point = TtftPoint(
                p.name, c, len(ttfts), len(errs), percentile(ttfts, 50), percentile(ttfts, 90),
                percentile(ttfts, 99), statistics.fmean(ttfts) if ttfts else float("nan"),
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


# --------------------------------------------------------------------------- CPU


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


async def cpu_batch(p: ProxyPath, kind: str, n: int, c: int, max_tokens: int, stream: bool,
                    limit_s: float) -> CpuRun:
    assert p.pid is not None
    await load(p, max(c, 20), c, min(max_tokens, 8), stream, 0.0, limit_s / 4)  # warm the pools
    await asyncio.sleep(0.2)
    probes = [CpuProbe({"proxy": p.pid}, read) for read in (cpu_seconds, tick_cpu_seconds, tree_cpu_seconds)]
    with probes[0].measure() as cpu, probes[1].measure() as tick, probes[2].measure() as tree:
        run = await load(p, n, c, max_tokens, stream, 0.0, limit_s)
    res = run.results
    ok = [r for r in res if r.ok]
    chunks = statistics.fmean(r.content_events for r in ok) if ok else 0.0
    threads = psutil.Process(p.pid).num_threads()
    return CpuRun(p.name, kind, len(res), len(res) - len(ok), cpu["proxy"], tick["proxy"], tree["proxy"], threads,
                  run.duration_s, chunks)


async def measure_cpu(proxies: list[ProxyPath], s: Settings, log: Log) -> list[CpuRun]:
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


async def idle_cpu(proxies: list[ProxyPath], seconds: float) -> dict[str, float]:
    with CpuProbe({p.name: p.pid for p in proxies if p.pid}).measure() as used:
        await asyncio.sleep(seconds)
    return {name: 1e3 * cpu_s / seconds for name, cpu_s in used.items()}


async def smoke(paths: list[ProxyPath]) -> None:
    """One streaming and one non-streaming request per path; refuse to measure a broken path."""
    for p in paths:
        r = await one_request(p, body_bytes(p, 5, True), True)
        if not r.ok or r.content_events != 5:
            raise RuntimeError(f"smoke test failed on {p.name} (stream, 5 tokens): {r}")
        r = await one_request(p, body_bytes(p, 5, False), False)
        if not r.ok:
            raise RuntimeError(f"smoke test failed on {p.name} (non-stream): {r}")


async def pyspy_profile(p: ProxyPath, s: Settings, out: Path, stamp: str, log: Log) -> dict[str, Any]:
    """Record the proxy with py-spy (1 kHz, with native frames) during a non-streaming batch and a
    long-streaming batch, each twice the measured size; these batches are not part of the measurements."""
    exe = executable()
    if exe is None:
        log("py-spy not found: .venv/bin/pip install py-spy")
        return {}
    assert p.pid is not None
    found: dict[str, Any] = {}
    batches = {"request": (s.req_n, s.req_concurrency, s.req_max_tokens, False),
               "stream_long": (s.chunk_concurrency, s.chunk_concurrency, s.chunk_long, True)}
    for kind, (n, c, max_tokens, stream) in batches.items():
        raw = out / f"pyspy-{stamp}-{p.name}-{kind}.txt"
        await load(p, max(c, 20), c, min(max_tokens, 8), stream, 0.0, s.point_time_limit_s / 4)

        async def batch(n: int = n, c: int = c, max_tokens: int = max_tokens, stream: bool = stream) -> RunResult:
            return await load(p, 2 * n, c, max_tokens, stream, 0.0, s.point_time_limit_s)

        err = await record(exe, p.pid, raw, s.point_time_limit_s, batch)
        if not raw.exists():
            log(f"py-spy wrote nothing for {p.name}/{kind}: {err[-300:]}")
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


# --------------------------------------------------------------------------- the run


async def run_bench(args: argparse.Namespace, s: Settings, procs: Procs, tmp: Path, log: Log) -> dict[str, Any]:
    """Start the emulator, the bare proxy and the gateway; measure; the result (settings, points, checks)."""
    host = machine()  # before anything starts: the gateway code this run measures
    host["gateway_src"] = str(args.gateway_src.resolve()) if args.gateway_src else None
    pin = pinning(args.no_pin)
    load_cpus, proxy_cpus = (pin.rest, {pin.proxy}) if pin.proxy is not None else (None, None)
    if pin.proxy is not None and load_cpus:
        log(f"pinning: proxy under test -> CPU {pin.proxy}; emulator + load generator -> CPU "
            f"{','.join(map(str, sorted(load_cpus)))}")
    else:
        log("pinning: OFF (" + ("--no-pin" if args.no_pin else f"only {len(os.sched_getaffinity(0))} CPU allowed")
            + ")")

    emu_port, bare_port, gw_port, h1_port = free_ports(4)
    # the gateway watches the routes file's folder for hot reload: keep the busy request log elsewhere
    (tmp / "config").mkdir()
    routes = tmp / "config" / "routes.yaml"
    routes.write_text(
        "tiers:\n  - name: small-int4\n    precision: int4\n    context_window: 8192\n"
        "    prices: {input_per_mtok: 0.05, output_per_mtok: 0.20}\n    replicas:\n"
        f'      - {{name: small-int4-a, url: "http://127.0.0.1:{emu_port}/v1", model: emulated}}\n'
    )
    gw_log = tmp / "gateway-requests.log"
    emu = procs.start("emulator", emulator_argv(emu_port, s.profile), load_cpus, tmp / "emulator.out")
    bare = procs.start("bare proxy", bare_proxy_argv(bare_port, f"http://127.0.0.1:{emu_port}"), proxy_cpus,
                       tmp / "bare.out")
    bare_h1 = procs.start("bare proxy (h1 client)", bare_proxy_argv(h1_port, f"http://127.0.0.1:{emu_port}", "h1"),
                          proxy_cpus, tmp / "bare-h1.out")
    src = args.gateway_src.resolve() if args.gateway_src else ROOT  # `python -m gateway` imports from its cwd
    policy = next(p for p in (src / "policies" / "emulator.yaml", ROOT / "policies" / "emulator.yaml") if p.exists())
    gw = procs.start("gateway", [sys.executable, "-m", "gateway", "serve", "--routes", str(routes), "--policies",
                                 str(policy), "--host", "127.0.0.1", "--port", str(gw_port), "--log-file",
                                 str(gw_log)], proxy_cpus, tmp / "gateway.out", cwd=src)
    wait_http(f"http://127.0.0.1:{emu_port}/health", emu, "emulator")
    wait_http(f"http://127.0.0.1:{bare_port}/v1/chat/completions", bare, "bare proxy", "POST")
    wait_http(f"http://127.0.0.1:{h1_port}/v1/chat/completions", bare_h1, "bare proxy (h1 client)", "POST")
    wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw, "gateway")

    auth = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    plain = {"Content-Type": "application/json"}
    paths = [
        ProxyPath("direct", f"http://127.0.0.1:{emu_port}/v1/chat/completions", "emulated", plain, None),
        ProxyPath("bare", f"http://127.0.0.1:{bare_port}/v1/chat/completions", "emulated", plain, bare.pid),
        ProxyPath("gateway", f"http://127.0.0.1:{gw_port}/v1/chat/completions", TIER, auth, gw.pid),
    ]
    # for CPU only, not in the targets: the bare proxy forwarding with the gateway's own upstream client
    h1 = ProxyPath("bare_h1", f"http://127.0.0.1:{h1_port}/v1/chat/completions", "emulated", plain, bare_h1.pid)
    timeout = aiohttp.ClientTimeout(total=120, sock_read=30)
    async with contextlib.AsyncExitStack() as stack:
        for p in [*paths, h1]:
            p.session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout, auto_decompress=False))
        await smoke([*paths, h1])
        log("smoke test ok on direct, bare, gateway, bare_h1")
        idle = await idle_cpu([*paths[1:], h1], 1.0)
        log("idle CPU: " + ", ".join(f"{k} {v:.2f} ms/s" for k, v in idle.items()))
        ttft: list[TtftPoint] = []
        runs: list[CpuRun] = []
        other = OtherWork([os.getpid(), emu.pid, bare.pid, gw.pid, bare_h1.pid])
        if args.only in (None, "ttft"):
            log("TTFT (streaming chat, ignore_eos, max_tokens=%d):" % s.ttft_max_tokens)
            with other.phase("ttft", log):
                ttft = await measure_ttft(paths, s, emu.pid, log)
            procs.check_alive()
        if args.only in (None, "cpu"):
            log("CPU in the proxy process (median of %d reps):" % s.cpu_reps)
            with other.phase("cpu", log):
                runs = await measure_cpu([*paths[1:], h1], s, log)
            procs.check_alive()
        profiles: dict[str, Any] = {}
        if args.py_spy:
            args.out.mkdir(parents=True, exist_ok=True)
            for p in paths[1:] if args.py_spy == "both" else paths[2:]:
                profiles[p.name] = await pyspy_profile(p, s, args.out, args.stamp, log)

    gw_lines = sum(1 for _ in gw_log.open("rb")) if gw_log.exists() else 0
    if gw_lines != paths[2].sent:
        log(f"WARNING: the gateway logged {gw_lines} request lines for {paths[2].sent} requests sent")
    cpu = {name: cpu_summary(runs, name) for name in ("bare", "gateway", "bare_h1")} if runs else {}
    return {
        "benchmark": "proxy_overhead", "machine": host, "settings": asdict(s), "pinned": pin.proxy is not None,
        "other_work": other.phases,
        "pinning": {"proxy_cpus": sorted(proxy_cpus or []), "emulator_and_loadgen_cpus": sorted(load_cpus or [])},
        "idle_cpu_ms_per_s": idle, "ttft": [asdict(t) for t in ttft], "cpu_runs": [asdict(r) for r in runs],
        "cpu": cpu, "checks": checks(ttft, cpu), "py_spy": profiles,
        "gateway_log_lines": gw_lines, "gateway_requests_sent": paths[2].sent,
    }


def checks(ttft: Sequence[TtftPoint], cpu: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The issue's targets: value, target, pass (and a note when the 95 % interval straddles the target)."""
    tt = {(t.path, t.concurrency): t for t in ttft}
    values: dict[str, float] = {}
    if cpu:
        values["cpu_per_request_ratio"] = cpu["gateway"]["cpu_us_per_request"] / cpu["bare"]["cpu_us_per_request"]
        values["cpu_per_chunk_ratio"] = cpu["gateway"]["cpu_us_per_chunk"] / cpu["bare"]["cpu_us_per_chunk"]
    if ("gateway", 32) in tt:
        values["added_ttft_p50_ms_c32"] = tt[("gateway", 32)].p50_ms - tt[("direct", 32)].p50_ms
    found: dict[str, dict[str, Any]] = {
        k: {"value": v, "target": TARGETS[k], "pass": bool(v <= TARGETS[k])} for k, v in values.items()
    }
    if "added_ttft_p50_ms_c32" in found and tt[("gateway", 32)].added_p50_ci95_ms:
        lo, hi = tt[("gateway", 32)].added_p50_ci95_ms or (0.0, 0.0)
        chk = found["added_ttft_p50_ms_c32"]
        chk["ci95"] = [lo, hi]
        if (lo <= chk["target"]) != (hi <= chk["target"]):
            chk["note"] = f"inconclusive: 95% CI [{lo:+.2f}, {hi:+.2f}] ms straddles the target"
    return found
