"""Shared pieces of bench/cache_bench.py and bench/classify_throughput.py.

Process handling (Procs, free_port, wait_http, cpu_seconds, machine) comes from
bench/proxy_overhead.py; this module adds what those two benchmarks need on top: config files for
a throw-away gateway, a bounded closed-loop load generator that keeps the gateway's response
headers, percentiles, Redis `INFO commandstats` and gateway /metrics readers, CPU pinning and the
result files. Everything listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (  # noqa: E402  (bench/ is not a package: scripts run as files)
    ROOT,
    OtherWork,
    Procs,
    cpu_seconds,
    free_port,
    machine,
    print_tails,
    wait_http,
)

__all__ = [
    "ROOT", "RESULTS", "OtherWork", "print_tails", "Procs", "cpu_seconds", "free_port", "machine", "wait_http", "Sample", "Phase",
    "closed_loop", "summarize", "pinning", "routes_yaml", "policy_yaml", "key_sha256", "commandstats",
    "diff_counts", "redis_ops", "RedisOps", "log_events", "loadavg", "load_line", "command_line", "write_results",
    "md_table",
    "sharegpt_prompts", "wait_quiet",
]

RESULTS = ROOT / "bench" / "results"
TIMEOUT = aiohttp.ClientTimeout(total=60, sock_read=30)


# --------------------------------------------------------------------------- load generator


@dataclass(slots=True)
class Sample:
    """One request as the client saw it."""

    index: int  # position in the body list
    ok: bool
    status: int
    latency_s: float
    cache: str | None = None  # x-gateway-cache
    tier: str | None = None  # x-gateway-tier
    difficulty: float | None = None  # x-gateway-difficulty
    error: str | None = None


async def post(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
               index: int) -> Sample:
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            data = await resp.read()
            latency = time.perf_counter() - t0
            h = resp.headers
            diff = h.get("x-gateway-difficulty")
            ok = resp.status == 200 and data.startswith(b"{") and b'"choices"' in data
            return Sample(index, ok, resp.status, latency, h.get("x-gateway-cache"), h.get("x-gateway-tier"),
                          float(diff) if diff else None, None if ok else data[:200].decode(errors="replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        return Sample(index, False, 0, time.perf_counter() - t0, error=f"{type(err).__name__}: {err}")


@dataclass
class Phase:
    """The outcome of one closed-loop run."""

    name: str
    samples: list[Sample]
    wall_s: float
    truncated: bool  # stopped by the time limit before all bodies were sent
    concurrency: int
    gateway_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def closed_loop(session: aiohttp.ClientSession, url: str, headers: dict[str, str], bodies: Sequence[bytes],
                      concurrency: int, time_limit_s: float, name: str = "",
                      cpu_pid: int | None = None) -> Phase:
    """`concurrency` workers send `bodies` in order, back to back (no think time), each the next body
    not yet taken; stops early after `time_limit_s`. `cpu_pid`: CPU seconds of that process are recorded."""
    todo: Iterator[int] = iter(range(len(bodies)))
    samples: list[Sample] = []
    deadline = time.perf_counter() + time_limit_s
    truncated = False

    async def worker() -> None:
        nonlocal truncated
        for i in todo:
            if time.perf_counter() > deadline:
                truncated = True
                return
            samples.append(await post(session, url, bodies[i], headers, i))

    cpu0 = cpu_seconds(cpu_pid) if cpu_pid else None
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(bodies)) or 1)))
    wall = time.perf_counter() - t0
    cpu = cpu_seconds(cpu_pid) - cpu0 if cpu_pid and cpu0 is not None else None
    return Phase(name, samples, wall, truncated, concurrency, cpu)


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def summarize(phase: Phase, only: Iterable[Sample] | None = None) -> dict[str, Any]:
    """n, errors, rps, latency percentiles (ms) of the phase (or of `only`, a subset of its samples)."""
    chosen = list(only) if only is not None else phase.samples
    good = [s.latency_s * 1e3 for s in chosen if s.ok]
    n = len(phase.samples)
    out: dict[str, Any] = {
        "name": phase.name, "concurrency": phase.concurrency, "n": len(chosen),
        "errors": sum(not s.ok for s in chosen), "wall_s": round(phase.wall_s, 3),
        "rps": n / phase.wall_s if phase.wall_s else float("nan"), "truncated": phase.truncated,
        "p50_ms": pct(good, 50), "p90_ms": pct(good, 90), "p99_ms": pct(good, 99),
        "max_ms": max(good) if good else float("nan"), "mean_ms": float(np.mean(good)) if good else float("nan"),
        "error_samples": sorted({s.error or str(s.status) for s in chosen if not s.ok})[:3],
    }
    if phase.gateway_cpu_s is not None and n:
        out["gateway_cpu_us_per_req"] = phase.gateway_cpu_s / n * 1e6
        out["gateway_core_util"] = phase.gateway_cpu_s / phase.wall_s if phase.wall_s else float("nan")
    return out


# --------------------------------------------------------------------------- processes and config


def pinning(no_pin: bool) -> tuple[set[int] | None, int | None, str]:
    """(CPUs for this process, the emulator and Redis; the CPU for the gateway; a sentence saying so).
    With two or more CPUs allowed: the gateway gets the last one alone, the rest get the others."""
    allowed = sorted(os.sched_getaffinity(0))
    if no_pin or len(allowed) < 2:
        why = "--no-pin" if no_pin else f"only {len(allowed)} CPU allowed"
        return None, None, f"pinning OFF ({why})"
    gw, rest = allowed[-1], set(allowed[:-1])
    os.sched_setaffinity(0, rest)  # children started from now on inherit it
    return rest, gw, (f"gateway pinned with `taskset -c {gw}` to CPU {gw}; load generator, emulator and Redis "
                      f"on CPU {','.join(map(str, sorted(rest)))}")


def gateway_argv(routes: Path, policies: Path, port: int, log_file: Path, redis_url: str | None,
                 cpu: int | None) -> list[str]:
    argv = [sys.executable, "-m", "gateway", "serve", "--routes", str(routes), "--policies", str(policies),
            "--host", "127.0.0.1", "--port", str(port), "--log-file", str(log_file)]
    argv += ["--redis-url", redis_url] if redis_url else ["--no-redis"]
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv


def emulator_argv(port: int, profile: str = "instant", seed: int = 1) -> list[str]:
    return [sys.executable, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", str(port),
            "--profile", profile, "--seed", str(seed)]


def routes_yaml(tiers: dict[str, list[tuple[str, str]]], redis_op_timeout_ms: float | None = None) -> str:
    """A routes file: tier name -> [(replica name, base URL)], every tier int4-priced, emulator tokenizer."""
    lines = ["upstream: {connect_timeout_s: 2, read_timeout_s: 30, max_attempts: 2}"]
    if redis_op_timeout_ms is not None:
        lines.append(f"redis: {{op_timeout_ms: {redis_op_timeout_ms}}}")
    lines.append("tiers:")
    for name, replicas in tiers.items():
        lines += [f"  - name: {name}", "    precision: int4", "    context_window: 1048576",
                  "    prices: {input_per_mtok: 0.05, output_per_mtok: 0.20}", "    tokenizer: emulator",
                  "    replicas:"]
        lines += [f'      - {{name: {r}, url: "{url}", model: emulated}}' for r, url in replicas]
    return "\n".join(lines) + "\n"


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def policy_yaml(default_tier: str, tenants: Sequence[dict[str, Any]], max_tokens: int = 16) -> str:
    """A policy file (JSON is YAML): the defaults, then the tenants as given (`key` turned into its hash)."""
    body: dict[str, Any] = {"default_tier": default_tier, "allow_anonymous": False,
                            "max_tokens": {"default": max_tokens, "maximum": 4096}, "tenants": []}
    for t in tenants:
        t = dict(t)
        t["api_key_sha256"] = key_sha256(t.pop("key"))
        body["tenants"].append(t)
    return json.dumps(body, indent=1) + "\n"


def wait_gateway(port: int, proc: Any, timeout_s: float = 60) -> None:
    wait_http(f"http://127.0.0.1:{port}/healthz", proc, "gateway", timeout_s=timeout_s)


# --------------------------------------------------------------------------- Redis and /metrics


def commandstats(client: Any) -> dict[str, int]:
    """calls per command from INFO commandstats (redis-py parses it into {cmdstat_x: {calls: ...}})."""
    info = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items() if isinstance(v, dict)}


def diff_counts(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


_METRIC = re.compile(r'^gateway_redis_(op_seconds_count|errors_total|op_seconds_bucket)'
                     r'\{(?:le="([^"]+)",)?op="([^"]+)"(?:,le="([^"]+)")?\}\s+([0-9.e+-]+)$')


@dataclass
class RedisOps:
    """The gateway's own count of its Redis calls, per op, from /metrics. Each RedisGuard.run that reaches
    Redis is one round trip (a pipeline or a script is one): `ok` answered within the guard's timeout,
    `failed` timed out or errored. Calls skipped while the guard holds Redis for down are counted nowhere
    (`up` is the gateway_redis_up gauge)."""

    ok: dict[str, float]
    failed: dict[str, float]
    buckets: dict[str, dict[str, float]]  # op -> le -> cumulative count of successful calls
    up: float | None

    def calls(self) -> dict[str, float]:
        return {k: self.ok.get(k, 0.0) + self.failed.get(k, 0.0) for k in sorted({*self.ok, *self.failed})}

    def minus(self, before: RedisOps) -> RedisOps:
        buckets = {op: {le: v - before.buckets.get(op, {}).get(le, 0.0) for le, v in b.items()}
                   for op, b in self.buckets.items()}
        return RedisOps(diff_counts(self.ok, before.ok), diff_counts(self.failed, before.failed), buckets, self.up)


def redis_ops(gateway_port: int) -> RedisOps:
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway_port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    ops = RedisOps({}, {}, {}, None)
    for line in text.splitlines():
        if line.startswith("gateway_redis_up "):
            ops.up = float(line.split()[1])
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        kind, le, op, value = m.group(1), m.group(2) or m.group(4), m.group(3), float(m.group(5))
        if kind == "op_seconds_count":
            ops.ok[op] = ops.ok.get(op, 0.0) + value
        elif kind == "errors_total":
            ops.failed[op] = ops.failed.get(op, 0.0) + value
        elif le is not None:
            ops.buckets.setdefault(op, {})[le] = value
    return ops


def log_events(path: Path) -> dict[str, Any]:
    """What the gateway's JSON log holds: events by name, and the request lines' `cache` field."""
    events: collections.Counter[str] = collections.Counter()
    cache: collections.Counter[str] = collections.Counter()
    with contextlib.suppress(OSError), path.open("rb") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            events[str(rec.get("event"))] += 1
            if rec.get("event") == "request":
                cache[str(rec.get("cache"))] += 1
    return {"events": dict(events), "cache": dict(cache)}


def wait_quiet(read: Any, settle_s: float = 0.3, limit_s: float = 5.0) -> None:
    """Poll `read()` until it stops changing for `settle_s` (background writes done), at most `limit_s`."""
    deadline = time.monotonic() + limit_s
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return


# --------------------------------------------------------------------------- workload


def sharegpt_prompts(count: int, *, distinct: bool, max_chars: int = 8000, skip: int = 0) -> list[str]:
    """The first `count` ShareGPT V3 first-turn prompts (after `skip`), in dataset order, at most
    `max_chars` long; `distinct`: each normalized text (whitespace runs collapsed) only once."""
    from gateway.classifier.sharegpt import first_exchanges

    out: list[str] = []
    seen: set[str] = set()
    skipped = 0
    for _, prompt, _ in first_exchanges():
        if len(prompt) > max_chars:
            continue
        if distinct:
            norm = " ".join(prompt.split())
            if norm in seen:
                continue
            seen.add(norm)
        if skipped < skip:
            skipped += 1
            continue
        out.append(prompt)
        if len(out) >= count:
            break
    return out


# --------------------------------------------------------------------------- reporting


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def load_line(label: str = "machine load") -> str:
    one, five, fifteen = os.getloadavg()
    return f"{label} (os.getloadavg 1/5/15 min): {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def command_line() -> str:
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    rule = align.split() if align else ["---"] * len(header)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def write_results(name: str, stamp: str, result: dict[str, Any], markdown: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    (RESULTS / f"{name}-{stamp}.md").write_text(markdown + "\n")
    return path


@contextlib.contextmanager
def session_timer(label: str, log: Any) -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    log(f"  ({label}: {time.perf_counter() - t0:.1f} s)")


@dataclass
class RunStart:
    """What every load benchmark records as it starts (and the process group it starts things in)."""

    started: float
    load_start: tuple[float, float, float]
    host: dict[str, Any]
    gw_cpu: int | None
    pin_note: str
    procs: Procs


def begin(no_pin: bool) -> RunStart:
    """SIGTERM behaves as Ctrl-C (children are stopped); machine facts; the gateway's CPU pinning."""
    import signal

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    started, load_start, host = time.monotonic(), loadavg(), machine()
    _, gw_cpu, pin_note = pinning(no_pin)
    print(pin_note, flush=True)
    return RunStart(started, load_start, host, gw_cpu, pin_note, Procs())
