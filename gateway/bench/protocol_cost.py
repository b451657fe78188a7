"""The cost of the translated protocols (bench/protocols.py, issue 19): gateway CPU per streamed request
of /v1/chat/completions, /v1/responses and /v1/messages at equal tokens; embeddings per second."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp

from gateway.bench.client import RequestResult
from gateway.bench.configs import policy_yaml
from gateway.bench.cpu import CpuProbe, per_request_us
from gateway.bench.procs import Procs, emulator_argv, free_ports, wait_http
from gateway.bench.runner import closed_loop

KEY = "sk-bench"
AUTH = {"Authorization": f"Bearer {KEY}"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CONTENT_MARKS = {"chat": b'"content":"', "responses": b"response.output_text.delta\n", "messages": b'"text_delta"'}
ROUTES = """tiers:
  - {{name: t, precision: int4, context_window: 8192, prices: {{input_per_mtok: 1, output_per_mtok: 2}},
     tokenizer: emulator, replicas: [{{name: t-a, url: "http://127.0.0.1:{port}/v1", model: emulated}}]}}
  - {{name: minilm, precision: fp32, context_window: 256, prices: {{input_per_mtok: 0.005, output_per_mtok: 0}},
     embedder: {{kind: minilm}}}}
"""
LOAD_CPU, GATEWAY_CPU = 0, 1  # the load generator beside the emulator; the gateway alone on CPU 1


async def long_prompt(session: aiohttp.ClientSession, emulator: str, max_tokens: int) -> str:
    """A prompt the emulator answers with at least `max_tokens` tokens (its answer length is drawn from the
    prompt's hash): every protocol then streams exactly `max_tokens` content events."""
    for i in range(1000):
        prompt = f"Say hello to the benchmark, take {i}."
        body = {"model": "emulated", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
        async with session.post(f"{emulator}/v1/chat/completions", json=body) as response:
            if (await response.json())["choices"][0]["finish_reason"] == "length":
                return prompt
    raise RuntimeError(f"no prompt of 1000 gets {max_tokens} tokens from the emulator")


async def stream_one(session: aiohttp.ClientSession, url: str, kind: str, prompt: str, max_tokens: int) -> RequestResult:
    """One stream of protocol `kind`; its content events counted in the whole body."""
    messages = [{"role": "user", "content": prompt}]
    body = {"model": "t", "stream": True, **({"input": prompt, "max_output_tokens": max_tokens} if kind == "responses"
                                             else {"messages": messages, "max_tokens": max_tokens})}
    async with session.post(url + PATHS[kind], json=body, headers=AUTH) as response:
        data = await response.read()
    ok = response.status == 200
    events = data.count(CONTENT_MARKS[kind]) - (1 if kind == "chat" else 0)  # chat: the role chunk's empty content
    return RequestResult(ok, response.status, content_events=events, error=None if ok else data[:300].decode())


async def cpu_per_request(session: aiohttp.ClientSession, url: str, pid: int, kind: str, n: int, concurrency: int,
                          prompt: str, max_tokens: int) -> tuple[float, float]:
    """(gateway CPU µs per request, content events per request) over `n` streams at `concurrency`."""

    async def sender(i: int) -> RequestResult:
        return await stream_one(session, url, kind, prompt, max_tokens)

    with CpuProbe({"gateway": pid}).measure() as used:
        run = await closed_loop(sender, n, concurrency)
    failed = [r for r in run.results if not r.ok]
    if failed:
        raise RuntimeError(f"{kind}: {len(failed)} of {n} streams failed, e.g. {failed[0].error}")
    return per_request_us(used["gateway"], n), sum(r.content_events for r in run.results) / n


async def embed_rate(session: aiohttp.ClientSession, url: str, inputs: list[str], concurrency: int = 4) -> float:
    """Inputs embedded per second, in batches of 16."""
    batches = [inputs[i:i + 16] for i in range(0, len(inputs), 16)]

    async def sender(i: int) -> RequestResult:
        async with session.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": batches[i]},
                                headers=AUTH) as response:
            data = await response.read()
        if response.status != 200:
            raise RuntimeError(f"embeddings: HTTP {response.status}: {data[:300]!r}")
        return RequestResult(True, response.status)

    run = await closed_loop(sender, len(batches), concurrency)
    return len(inputs) / run.duration_s


async def measure(url: str, emulator: str, pid: int, args: argparse.Namespace) -> dict[str, object]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        prompt = await long_prompt(session, emulator, args.max_tokens)
        for kind in PATHS:  # warm up each path (and the emulator's tokenizer)
            await cpu_per_request(session, url, pid, kind, 50, args.concurrency, prompt, args.max_tokens)
        runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in PATHS}
        for _ in range(args.rounds):
            for kind in PATHS:
                runs[kind].append(await cpu_per_request(session, url, pid, kind, args.requests // args.rounds,
                                                        args.concurrency, prompt, args.max_tokens))
        cpu = {kind: sorted(r[0] for r in rs)[len(rs) // 2] for kind, rs in runs.items()}  # median of rounds
        tokens = {kind: sum(r[1] for r in rs) / len(rs) for kind, rs in runs.items()}
        stamp = time.time_ns()
        fresh = [f"Benchmark sentence {i} of run {stamp}: how far is the moon tonight?" for i in range(args.inputs)]
        cold = await embed_rate(session, url, fresh)
        lru = await embed_rate(session, url, fresh[-2048:])
        more = [f"Another sentence {i} of run {stamp}, about rivers and bridges." for i in range(8192)]
        await embed_rate(session, url, more)  # now in Redis; the LRU keeps only the last 4096
        await asyncio.sleep(1.0)  # the write-behind to Redis ends
        redis = await embed_rate(session, url, more)  # in order: each one was evicted from the LRU
    return {"cpu_us_per_request": cpu, "content_events_per_request": tokens,
            "rounds_us": {kind: [round(r[0]) for r in rs] for kind, rs in runs.items()},
            "loadavg_1m_end": os.getloadavg()[0],
            "ratio_vs_chat": {k: cpu[k] / cpu["chat"] for k in cpu},
            "embeddings_per_s": {"cold": cold, "warm_lru": lru, "warm_redis": redis}}


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    """The emulator (CPU 0, with this process) and `gateway serve` (CPU 1, its embedded Redis); measure."""
    os.sched_setaffinity(0, {LOAD_CPU})
    procs = Procs()
    emu_port, gw_port = free_ports(2)
    (tmp / "config").mkdir()
    (tmp / "config" / "routes.yaml").write_text(ROUTES.format(port=emu_port))
    (tmp / "config" / "policy.json").write_text(policy_yaml("t", [{"name": "bench", "key": KEY}], 64))
    try:
        emu = procs.start("emulator", emulator_argv(emu_port), {LOAD_CPU}, tmp / "emulator.out")
        gw = procs.start("gateway", [sys.executable, "-m", "gateway", "serve", "--routes",
                                     str(tmp / "config" / "routes.yaml"), "--policies",
                                     str(tmp / "config" / "policy.json"), "--port", str(gw_port),
                                     "--log-file", str(tmp / "requests.log")], {GATEWAY_CPU}, tmp / "gateway.out")
        wait_http(f"http://127.0.0.1:{emu_port}/health", emu, "emulator")
        wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw, "gateway", timeout_s=60)
        return asyncio.run(measure(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{emu_port}", gw.pid, args))
    finally:
        procs.close()
