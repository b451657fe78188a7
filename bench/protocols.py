"""Issue 19: the cost of the translated protocols, and embeddings per second on one core.

    .venv/bin/python bench/protocols.py [--requests 400] [--concurrency 8] [--max-tokens 64] [--inputs 4096]

Starts an emulator (profile `instant`, CPU 0, with this load generator) and `gateway serve` (CPU 1, its
embedded Redis, request log to a temp file) with a chat tier and the in-process MiniLM embedding tier, then:

1. CPU per request of the gateway process (its threads' schedstat time, Redis excluded) for streaming
   /v1/chat/completions, /v1/responses and /v1/messages asking the same prompt and `max_tokens`, in
   interleaved rounds (median of the rounds); the prompt is one the emulator answers past `max_tokens`,
   and the content events per request are counted: the comparison is at equal tokens.
2. Embeddings per second: batches of 16 new inputs (cold: encoded), the same inputs again while they are in
   the gateway's LRU (warm, in process), and a pass over twice the LRU's 4096 entries so that every input
   comes from Redis (warm, Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path[:0] = [str(Path(__file__).resolve().parent)]
from _load import emulator_argv, free_port, policy_yaml  # noqa: E402
from proxy_overhead import Procs, cpu_seconds, wait_http  # noqa: E402
os.sched_setaffinity(0, {0})  # the load generator beside the emulator; the gateway alone on CPU 1

KEY = "sk-bench"
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CONTENT_MARKS = {"chat": b'"content":"', "responses": b"response.output_text.delta\n", "messages": b'"text_delta"'}
ROUTES = """tiers:
  - {{name: t, precision: int4, context_window: 8192, prices: {{input_per_mtok: 1, output_per_mtok: 2}},
     tokenizer: emulator, replicas: [{{name: t-a, url: "http://127.0.0.1:{port}/v1", model: emulated}}]}}
  - {{name: minilm, precision: fp32, context_window: 256, prices: {{input_per_mtok: 0.005, output_per_mtok: 0}},
     embedder: {{kind: minilm}}}}
"""


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


async def stream_one(session: aiohttp.ClientSession, url: str, kind: str, prompt: str, max_tokens: int) -> int:
    messages = [{"role": "user", "content": prompt}]
    body = {"model": "t", "stream": True, **({"input": prompt, "max_output_tokens": max_tokens} if kind == "responses"
                                             else {"messages": messages, "max_tokens": max_tokens})}
    async with session.post(url + PATHS[kind], json=body, headers={"Authorization": f"Bearer {KEY}"}) as response:
        data = await response.read()
    assert response.status == 200, data[:300]
    return data.count(CONTENT_MARKS[kind]) - (1 if kind == "chat" else 0)  # chat: the role chunk's empty content


async def cpu_per_request(session: aiohttp.ClientSession, url: str, pid: int, kind: str, n: int, concurrency: int,
                          prompt: str, max_tokens: int) -> tuple[float, float]:
    """(gateway CPU µs per request, content events per request) over `n` streams at `concurrency`."""
    queue = iter(range(n))
    tokens: list[int] = []

    async def worker() -> None:
        for _ in queue:
            tokens.append(await stream_one(session, url, kind, prompt, max_tokens))

    before = cpu_seconds(pid)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (cpu_seconds(pid) - before) / n * 1e6, sum(tokens) / n


async def embed_rate(session: aiohttp.ClientSession, url: str, inputs: list[str], concurrency: int = 4) -> float:
    """Inputs embedded per second, in batches of 16."""
    batches = iter([inputs[i:i + 16] for i in range(0, len(inputs), 16)])

    async def worker() -> None:
        for batch in batches:
            async with session.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": batch},
                                    headers={"Authorization": f"Bearer {KEY}"}) as response:
                assert response.status == 200, await response.text()
                await response.read()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(inputs) / (time.perf_counter() - started)


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--inputs", type=int, default=2048)
    args = parser.parse_args()
    procs = Procs()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        emu_port, gw_port = free_port(), free_port()
        (tmp / "config").mkdir()
        (tmp / "config" / "routes.yaml").write_text(ROUTES.format(port=emu_port))
        (tmp / "config" / "policy.json").write_text(policy_yaml("t", [{"name": "bench", "key": KEY}], 64))
        try:
            emu = procs.start("emulator", emulator_argv(emu_port), {0}, tmp / "emulator.out")
            gw = procs.start("gateway", [sys.executable, "-m", "gateway", "serve", "--routes",
                                         str(tmp / "config" / "routes.yaml"), "--policies",
                                         str(tmp / "config" / "policy.json"), "--port", str(gw_port),
                                         "--log-file", str(tmp / "requests.log")], {1}, tmp / "gateway.out")
            wait_http(f"http://127.0.0.1:{emu_port}/health", emu, "emulator")
            wait_http(f"http://127.0.0.1:{gw_port}/healthz", gw, "gateway", timeout_s=60)
            result = asyncio.run(measure(f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{emu_port}", gw.pid, args))
        finally:
            procs.close()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
