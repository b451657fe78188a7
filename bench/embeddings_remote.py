"""Issue 19: embeddings per second through the gateway on one core, with a remote embedding tier.

    .venv/bin/python bench/embeddings_remote.py [--inputs 4096] [--batch 16] [--concurrency 4] [--llama]

`gateway serve` runs alone on CPU 1 with its embedded Redis; this process (the load generator) and the
upstream share CPU 0. The upstream is a fake OpenAI embedding server answering at once with 384-dimension
vectors (the gateway's cost alone), or with `--llama` a real llama.cpp embedding server (Gemma 3 270M Q4_K_M,
mean-pooled, 640 dimensions, one thread: the model's cost). Batches of `--batch` new inputs (cold: every input
goes upstream), then the same inputs again (warm: every input comes from Redis). Prints embeddings per second
and the gateway's CPU seconds per 1,000 embeddings (utime + stime of its process: Redis excluded).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from aiohttp import web

KEY = "sk-bench"
LOAD_CPU, GATEWAY_CPU = 0, 1
POLICY = """default_tier: emb
max_tokens: {{default: 16, maximum: 64}}
tenants:
  - {{name: bench, api_key_sha256: {key}}}
"""
ROUTES = """tiers:
  - {{name: emb, precision: fp16, context_window: 512, endpoint: embeddings, dimensions: {dims},
     prices: {{input_per_mtok: 0.01, output_per_mtok: 0}},
     replicas: [{{name: emb-0, url: "{url}", model: {model}}}]}}
"""
LLAMA_FLAGS = ["--embedding", "true", "--kv_overrides", "gemma3.pooling_type=int:1"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fake_upstream(dims: int) -> web.Application:
    """An embedding server that answers every batch at once with one fixed vector per input (usage: one token
    per word): as little of CPU 0 as it can take, which the load generator shares."""
    vector = np.random.default_rng(0).standard_normal(dims).astype(np.float32).tolist()

    async def embeddings(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(body["input"]))]
        words = sum(len(text.split()) for text in body["input"])
        return web.Response(body=orjson.dumps({"object": "list", "data": data, "model": body["model"],
                                               "usage": {"prompt_tokens": words, "total_tokens": words}}),
                            content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-embed", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    return app


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while True:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s")
            await asyncio.sleep(0.2)


async def rate(session: aiohttp.ClientSession, url: str, inputs: list[str], batch: int, concurrency: int,
               pid: int) -> dict[str, Any]:
    """Embeddings per second over `inputs` in batches, `concurrency` requests in flight; the gateway's CPU."""
    batches = [inputs[i:i + batch] for i in range(0, len(inputs), batch)]
    queue = iter(batches)
    caches: list[str] = []

    async def worker() -> None:
        for texts in queue:
            async with session.post(f"{url}/v1/embeddings", json={"model": "emb", "input": texts},
                                    headers={"Authorization": f"Bearer {KEY}"}) as response:
                data = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {data[:300]!r}")
                caches.append(response.headers.get("x-gateway-backend", "") or "hit")

    cpu, start = cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, used = time.perf_counter() - start, cpu_seconds(pid) - cpu
    return {"embeddings_per_s": round(len(inputs) / wall, 1), "gateway_cpu_s_per_1000": round(1000 * used / len(inputs), 3),
            "gateway_cpu_share": round(used / wall, 2), "requests_answered_from_cache": caches.count("hit")}


async def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    os.sched_setaffinity(0, {LOAD_CPU})
    runner, children = None, []
    try:
        if args.llama:
            from gateway.config import Replica
            from gateway.local.children import launch_command

            up_port = free_port()
            replica = Replica.model_validate({"name": "llama", "url": f"http://127.0.0.1:{up_port}/v1",
                                              "model": "gemma-embed", "launch": {"kind": "llama_cpp",
                                              "model": "gemma3-270m-q4_k_m", "n_threads": 1, "n_ctx": 512}})
            children.append(subprocess.Popen([*launch_command(replica), *LLAMA_FLAGS], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.STDOUT, start_new_session=True))
            upstream, dims, model = replica.url, 640, "gemma-embed"
        else:
            runner = web.AppRunner(fake_upstream(384), access_log=None)
            await runner.setup()
            up_port = free_port()
            await web.TCPSite(runner, "127.0.0.1", up_port).start()
            upstream, dims, model = f"http://127.0.0.1:{up_port}/v1", 384, "fake-embed"
        await wait_http(f"{upstream}/models")  # before the gateway's first health check
        (tmp / "routes.yaml").write_text(ROUTES.format(dims=dims, url=upstream, model=model))
        (tmp / "policy.yaml").write_text(POLICY.format(key=hashlib.sha256(KEY.encode()).hexdigest()))
        gw_port = free_port()
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--routes", str(tmp / "routes.yaml"), "--policies",
             str(tmp / "policy.yaml"), "--port", str(gw_port), "--log-file", str(tmp / "requests.log")],
            stdout=(tmp / "gateway.out").open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {GATEWAY_CPU}))
        children.append(gateway)
        await wait_http(f"http://127.0.0.1:{gw_port}/healthz")
        url, stamp = f"http://127.0.0.1:{gw_port}", time.time_ns()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            warmup = [f"Warm-up sentence {i} of run {stamp}." for i in range(128)]
            await rate(session, url, warmup, args.batch, args.concurrency, gateway.pid)
            fresh = [f"Benchmark sentence {i} of run {stamp}: how far is the moon tonight?" for i in range(args.inputs)]
            cold = await rate(session, url, fresh, args.batch, args.concurrency, gateway.pid)
            await asyncio.sleep(1.0)  # the write-behind to Redis ends
            warm = await rate(session, url, fresh, args.batch, args.concurrency, gateway.pid)
        return {"upstream": "llama.cpp" if args.llama else "fake (instant)", "dimensions": dims,
                "inputs": args.inputs, "batch": args.batch, "concurrency": args.concurrency,
                "cold": cold, "warm_redis": warm, "loadavg_1m_end": os.getloadavg()[0]}
    finally:
        for child in children:
            child.terminate()
            child.wait(timeout=10)
        if runner is not None:
            await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--llama", action="store_true", help="a real llama.cpp embedding server upstream")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args, Path(tmp))), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
