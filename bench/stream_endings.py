"""Issue 18's check on the real path: SDK streams with `include_usage` through `gateway up` on the local
llama.cpp tiers (routes/local.yaml, policies/local.yaml; free ports instead of 8101-8103).

    .venv/bin/python bench/stream_endings.py [--requests 100] [--max-tokens 16] [--concurrency 3]

Each stream must end with exactly one finish reason and a usage chunk (empty choices) whose counts equal
its request log line's, and the log line must say 200 ok (the SDK closes its connection right after [DONE]).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from openai import AsyncOpenAI

from gateway.bench.procs import free_port
from gateway.bench.readers import log_lines
from gateway.bench.report import ROOT
from gateway.testing import wait_ready

MODELS = ("small-q4", "auto", "large-f16")
TOPICS = ("tail latency", "queues", "caches", "routers", "GPUs", "tokens", "batching", "prefill", "decoding", "SLOs")


async def ready(url: str) -> None:
    """Wait for `gateway up` (llama.cpp servers included) to answer /readyz."""
    async with aiohttp.ClientSession() as session:
        await wait_ready(session, url, timeout_s=180.0, every_s=0.5)


def start_gateway(work: Path, port: int) -> subprocess.Popen[bytes]:
    """`gateway up` (what `make run` runs) on routes/local.yaml with its replicas moved to free ports."""
    routes = yaml.safe_load((ROOT / "routes/local.yaml").read_text())
    for tier in routes["tiers"]:
        for replica in tier["replicas"]:
            replica["url"] = f"http://127.0.0.1:{free_port()}/v1"
    (work / "routes.yaml").write_text(yaml.safe_dump(routes))
    return subprocess.Popen([sys.executable, "-m", "gateway", "up", "--routes", str(work / "routes.yaml"),
                             "--policies", str(ROOT / "policies/local.yaml"), "--port", str(port),
                             "--log-file", str(work / "requests.log"), "--backend-logs", str(work / "backends")],
                            stderr=(work / "gateway.err").open("wb"))


async def one(client: AsyncOpenAI, i: int, max_tokens: int) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        model=MODELS[i % len(MODELS)], max_tokens=max_tokens, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": f"Request {i}: say something about {TOPICS[i % len(TOPICS)]}."}])
    chunks = [chunk async for chunk in stream]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    last = chunks[-1] if chunks else None
    usage = last.usage if last is not None and not last.choices else None
    return {"id": stream.response.headers["x-request-id"], "reasons": reasons,
            "usage": None if usage is None else (usage.prompt_tokens, usage.completion_tokens)}


async def run(url: str, requests: int, max_tokens: int, concurrency: int) -> list[dict[str, Any]]:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-demo", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def limited(i: int) -> dict[str, Any]:
        async with gate:
            return await one(client, i, max_tokens)

    return list(await asyncio.gather(*(limited(i) for i in range(requests))))


def report(results: list[dict[str, Any]], lines: dict[str, dict[str, Any]], args: argparse.Namespace,
           elapsed_s: float) -> bool:
    checks: Counter[str] = Counter()
    for r in results:
        line = lines.get(r["id"], {})
        checks["one finish reason"] += len(r["reasons"]) == 1
        checks["usage chunk"] += r["usage"] is not None
        checks["usage == log line"] += r["usage"] == (line.get("prompt_tokens"), line.get("completion_tokens"))
        checks["log 200 ok"] += (line.get("status"), line.get("outcome")) == (200, "ok")
    n = len(results)
    print(f"# {n} SDK streams, include_usage, max_tokens={args.max_tokens}, concurrency={args.concurrency}, "
          f"models {'/'.join(MODELS)} in turn; {elapsed_s:.1f} s; nproc={os.cpu_count()}")
    for name, count in checks.items():
        print(f"{name}: {count}/{n}")
    print("finish reasons:", dict(Counter(reason for r in results for reason in r["reasons"])))
    print("log lines:", dict(Counter((line["status"], line["outcome"], line["error"], line["usage_source"])
                                     for line in lines.values())))
    return all(count == n for count in checks.values())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stream-endings-"))
    port = free_port()
    gateway = start_gateway(work, port)
    try:
        url = f"http://127.0.0.1:{port}"
        asyncio.run(ready(url))
        started = time.perf_counter()
        results = asyncio.run(run(url, args.requests, args.max_tokens, args.concurrency))
        elapsed = time.perf_counter() - started
        lines = log_lines(work / "requests.log", {r["id"] for r in results})
    finally:
        gateway.send_signal(signal.SIGTERM)  # `gateway up` stops its llama.cpp servers
        gateway.wait(timeout=60)
    print(f"(logs in {work})")
    return 0 if report(results, lines, args, elapsed) else 1


if __name__ == "__main__":
    sys.exit(main())
