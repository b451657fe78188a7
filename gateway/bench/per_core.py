"""Requests per second per core (bench/req_per_core.py, issue 23): the bare aiohttp proxy, the gateway
and LiteLLM in front of one instant emulator, each driven by wrk (gateway.bench.closed_loop).

Each proxy is pinned to its own CPU (the last one), the emulator and wrk to the others. Workloads:
chat completions with a short output, non-streaming and streaming, each at a fixed concurrency for
a fixed time; repetitions interleave the proxies (order reversed every repetition). Per proxy and
workload: responses / wall seconds (req/s) and responses / the proxy tree's CPU seconds (per core).
"""

from __future__ import annotations

import json
import re
import statistics
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.bench import litellm_env
from gateway.bench.closed_loop import LoadSpec, Measurement, measure
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import Log
from gateway.bench.procs import Procs, bare_proxy_argv, free_port, wait_http
from gateway.bench.stack import start_gateway, start_stack

KEY = "sk-bench"
TIER = "small"
PROMPT = [{"role": "user", "content": "Say hello to the benchmark in a few words."}]
WORKLOADS = {"chat": False, "chat-stream": True}  # name -> streamed
JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Proxy:
    name: str
    url: str  # …/v1/chat/completions
    model: str
    headers: dict[str, str]
    pids: list[int]  # the processes charged to it (their trees)


@dataclass(frozen=True, slots=True)
class Variant:
    """Another gateway measured in the same run, on the same emulator and Redis: `tree`, another checkout's
    gateway (a `git worktree` of the commit before a change: "before and after, same run"), else this one's;
    `replay_fields` False: its policy's `log_replay_fields: false`."""

    name: str  # as the tables show it: "gateway (...)"
    tree: Path | None = None
    replay_fields: bool = True


@dataclass(frozen=True, slots=True)
class Settings:
    concurrency: int
    duration_s: int
    warmup_s: int
    reps: int
    max_tokens: int


def chat_body(model: str, stream: bool, max_tokens: int) -> bytes:
    """A short chat request; `ignore_eos` so that every path produces `max_tokens` tokens."""
    return json.dumps({"model": model, "messages": PROMPT, "max_tokens": max_tokens, "stream": stream,
                       "ignore_eos": True}, separators=(",", ":")).encode()


def start_proxies(procs: Procs, tmp: Path, redis: tuple[str, int], cpu: int | None,
                  litellm: bool, replay_fields: bool = True,
                  variants: Sequence[Variant] = ()) -> tuple[int, list[Proxy]]:
    """The emulator (profile instant) and the gateway on it (start_stack: `redis` = (URL, pid), charged to
    the gateway; `replay_fields` False: its policy's `log_replay_fields: false`), each of `variants` on the same
    emulator and Redis, the bare proxy and LiteLLM; the proxies on `cpu`. (emulator pid, the proxies)."""
    pin = {cpu} if cpu is not None else None
    stack = start_stack(procs, tmp, routes, _policy(replay_fields), profile="instant", redis_url=redis[0], gw_cpu=cpu)
    emu_url = stack.emulator_urls[0]  # …/v1
    port = free_port()
    bare = procs.start("bare", bare_proxy_argv(port, emu_url.removesuffix("/v1")), pin, tmp / "bare.out")
    wait_http(f"http://127.0.0.1:{port}/v1/models", bare, "bare proxy", method="POST")
    auth = {**JSON, "Authorization": f"Bearer {KEY}"}
    proxies = [Proxy("bare proxy", f"http://127.0.0.1:{port}/v1/chat/completions", "emulated", JSON, [bare.pid]),
               Proxy("gateway", stack.gateway_url + "/chat/completions", TIER, auth, [stack.gateway_pid, redis[1]])]
    for i, variant in enumerate(sorted(variants, key=lambda v: v.tree is not None)):  # baselines last: `ratios`
        folder = tmp / f"variant-{i + 1}"
        (folder / "config").mkdir(parents=True)
        (folder / "config" / "routes.yaml").write_text(routes([emu_url]))
        (folder / "config" / "policy.yaml").write_text(_policy(variant.replay_fields))
        gw_port, gw_pid = start_gateway(procs, folder, f"gateway-{i + 1}", redis[0], cpu, tree=variant.tree)
        proxies.append(Proxy(variant.name, f"http://127.0.0.1:{gw_port}/v1/chat/completions", TIER, auth,
                             [gw_pid, redis[1]]))
    if litellm:
        port, pid = litellm_env.start(procs, tmp, emu_url, pin)
        proxies.append(Proxy("LiteLLM", f"http://127.0.0.1:{port}/v1/chat/completions", TIER, JSON, [pid]))
    return stack.emulator_pids[0], proxies


def routes(urls: Sequence[str]) -> str:
    return routes_yaml({TIER: [(f"{TIER}-a", urls[0])]})


def _policy(replay_fields: bool) -> str:
    return policy_yaml(TIER, [{"name": "bench", "key": KEY}], max_tokens=16,
                       **({} if replay_fields else {"log_replay_fields": False}))


def smoke(p: Proxy, stream: bool, max_tokens: int) -> int:
    """One request through `p`; the content tokens it got back (raises unless 200 and complete)."""
    req = urllib.request.Request(p.url, chat_body(p.model, stream, max_tokens), p.headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        text = resp.read().decode()
    if not stream:
        return int(json.loads(text)["usage"]["completion_tokens"])
    events = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        raise RuntimeError(f"{p.name}: the stream did not end with [DONE]: {text[-300:]!r}")
    chunks = [json.loads(e) for e in events[:-1]]
    return sum(1 for c in chunks if c.get("choices") and (c["choices"][0].get("delta") or {}).get("content"))


def run_rounds(procs: Procs, exe: str, proxies: Sequence[Proxy], emulator_pid: int, s: Settings, folder: Path,
               cpus: set[int] | None, log: Log) -> list[Measurement]:
    """Warm-up of each proxy and workload, then `s.reps` interleaved repetitions; every measurement."""
    def one(p: Proxy, workload: str, seconds: int, tag: str) -> Measurement:
        spec = LoadSpec(p.url, chat_body(p.model, WORKLOADS[workload], s.max_tokens), p.headers, s.concurrency,
                        seconds)
        name = f"wrk-{tag}-{workload}-{re.sub('[^a-z0-9]+', '-', p.name.lower()).strip('-')}"
        return measure(procs, exe, spec, folder, name, proxy=p.name, workload=workload, proxy_pid=p.pids,
                       emulator_pid=emulator_pid, cpus=cpus)

    for p in proxies:
        for workload in WORKLOADS:
            one(p, workload, s.warmup_s, "warmup")
    found: list[Measurement] = []
    for rep in range(s.reps):
        for workload in WORKLOADS:
            for p in proxies if rep % 2 == 0 else proxies[::-1]:
                m = one(p, workload, s.duration_s, f"rep{rep + 1}")
                procs.check_alive()
                found.append(m)
                log(f"  rep {rep + 1} {workload:<11} {p.name:<10} {m.run.rps:8.0f} req/s  p50 {m.run.p50_ms:7.2f} ms  "
                    f"p99 {m.run.p99_ms:7.2f} ms  proxy CPU {m.proxy_cpu_s:5.2f} s -> {m.per_core:7.0f} req/s/core  "
                    f"(proxy busy {m.proxy_busy:.2f}, emulator+wrk {m.load_busy:.2f}, other {m.other_cores:.2f}, "
                    f"errors {m.run.failed})")
    return found


def summarize(found: Sequence[Measurement]) -> list[dict[str, Any]]:
    """One row per proxy and workload over its repetitions: responses / summed wall and CPU seconds,
    the median of the repetitions' p50 and p99."""
    rows: list[dict[str, Any]] = []
    keys = dict.fromkeys((m.workload, m.proxy) for m in found)
    for workload, proxy in sorted(keys, key=lambda k: list(WORKLOADS).index(k[0])):
        ms = [m for m in found if (m.workload, m.proxy) == (workload, proxy)]
        ok, wall = sum(m.run.ok for m in ms), sum(m.run.duration_s for m in ms)
        cpu = sum(m.proxy_cpu_s for m in ms)
        rows.append({
            "workload": workload, "proxy": proxy, "reps": len(ms), "responses": ok, "wall_s": wall,
            "errors": sum(m.run.failed for m in ms), "rps": ok / wall, "proxy_cpu_s": cpu,
            "per_core": ok / cpu if cpu else 0.0, "per_core_reps": [m.per_core for m in ms],
            "p50_ms": statistics.median(m.run.p50_ms for m in ms),
            "p99_ms": statistics.median(m.run.p99_ms for m in ms),
            "proxy_busy": cpu / wall, "load_busy": sum(m.emulator_cpu_s + m.loadgen_cpu_s for m in ms) / wall,
            "loadgen_busy": sum(m.loadgen_cpu_s for m in ms) / wall, "other_cores_max": max(m.other_cores for m in ms),
        })
    return rows


def ratios(rows: Sequence[dict[str, Any]], target: float) -> dict[str, str]:
    """gateway / LiteLLM and gateway / bare proxy, req/s per core, per workload; the issue's target. With
    variants (`Variant`), each gateway / each variant listed after it, whole and repetition by repetition
    (interleaved, so each pair ran back to back: the spread of those is the run's noise)."""
    by = {(r["workload"], r["proxy"]): r for r in rows}
    out: dict[str, str] = {}
    for workload in WORKLOADS:
        g = by.get((workload, "gateway"))
        for other in ("LiteLLM", "bare proxy"):
            o = by.get((workload, other))
            if g is None or o is None or not o["per_core"]:
                continue
            ratio = g["per_core"] / o["per_core"]
            name = f"{workload}: gateway / {other}, req/s per core"
            value = f"{ratio:.{1 if other == 'LiteLLM' else 2}f}x ({g['per_core']:.0f} vs {o['per_core']:.0f})"
            if other == "LiteLLM" and workload == "chat":
                name += f" (target ≥ {target:g}x)"
                value += " PASS" if ratio >= target else " FAIL"
            out[name] = value
        gateways = [r for r in rows if r["workload"] == workload and r["proxy"].startswith("gateway")]
        for i, a in enumerate(gateways):
            for b in gateways[i + 1:]:
                if b["per_core"]:
                    out[f"{workload}: {a['proxy']} / {b['proxy']}, req/s per core"] = (
                        f"{a['per_core'] / b['per_core']:.3f}x ({a['per_core']:.0f} vs {b['per_core']:.0f}); per "
                        "repetition " + " / ".join(f"{x / y:.3f}" for x, y in zip(a["per_core_reps"],
                                                                               b["per_core_reps"]) if y))
    return out
