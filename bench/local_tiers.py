"""Local llama.cpp tiers (issue 3): TTFT/TPOT per tier, direct vs through the gateway, start-up time,
and the token prices that follow from a documented CPU-hour cost.

    .venv/bin/python bench/local_tiers.py [--requests 5]

Each tier runs one llama.cpp server with one thread (prices are per vCPU-second). Requests are
streamed one at a time (a llama.cpp server serves one request at a time); every prompt starts
with a unique prefix so llama.cpp's prompt cache cannot skip its prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from gateway.bench.client import send
from gateway.bench.procs import free_port
from gateway.bench.report import ROOT
from gateway.config.loader import load_routes
from gateway.local.children import start_children, stop_children, wait_healthy
from gateway.tokens import TokenCounters

VM_USD_PER_HOUR = 0.0816  # 2-vCPU on-demand VM (AWS m7g.large, us-east-1, June 2026)
VCPUS = 2
LONG_WORDS = ("latency throughput queue replica token prefill decode cache batch router tier gateway policy "
              "budget tenant stream chunk backend quantized precision memory bandwidth compute kernel").split()


def long_prompt(tokens: int, counter_count: Callable[[str], int]) -> str:
    words, i = [], 0
    while True:
        words.append(LONG_WORDS[(i * 7) % len(LONG_WORDS)])
        i += 1
        if i % 50 == 0 and counter_count(" ".join(words)) >= tokens:
            return " ".join(words)


async def stream_once(session: aiohttp.ClientSession, url: str, model: str, prompt: str, headers: dict[str, str],
                      max_tokens: int) -> tuple[float, float, int]:
    """(TTFT ms, mean gap between content events ms, content events) of one streamed request."""
    body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                         "stream": True})
    r = await send(session, f"{url}/chat/completions", body, {"Content-Type": "application/json", **headers})
    if not r.ok or r.ttft_s is None or r.content_events < 2:
        raise RuntimeError(f"{model} at {url}: {r.error or f'{r.content_events} content events'}")
    return r.ttft_s * 1000, sum(r.itl_s) * 1000 / len(r.itl_s), r.content_events


async def measure(tiers: list[tuple[str, str, str]], gateway_url: str, prompts: dict[str, list[str]],
                  max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for tier, direct_url, upstream_model in tiers:
            for kind, texts in prompts.items():
                got: dict[str, list[tuple[float, float, int]]] = {"direct": [], "gateway": []}
                for i, text in enumerate(texts):  # interleave the two paths so drift hits both alike
                    got["direct"].append(await stream_once(session, direct_url, upstream_model, f"[d{i}] {text}",
                                                           {}, max_tokens))
                    got["gateway"].append(await stream_once(session, gateway_url, tier, f"[g{i}] {text}",
                                                            {"Authorization": "Bearer sk-demo"}, max_tokens))
                for path, results in got.items():
                    ttfts, tpots = [r[0] for r in results], [r[1] for r in results]
                    rows.append({"tier": tier, "prompt": kind, "path": path, "n": len(results),
                                 "ttft_p50_ms": statistics.median(ttfts), "ttft_max_ms": max(ttfts),
                                 "tpot_p50_ms": statistics.median(tpots)})
    return rows


def startup_seconds() -> float:
    """`gateway up` with the shipped routes/local.yaml (models already built) until /readyz answers."""
    import urllib.request

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--routes", str(ROOT / "routes/local.yaml"),
                                "--policies", str(ROOT / "policies/local.yaml"), "--port", str(port),
                                "--log-file", os.devnull], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < 120:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    return time.perf_counter() - start
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("gateway up was not ready in 120 s")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    shipped = yaml.safe_load((ROOT / "routes/local.yaml").read_text())
    shipped["tiers"] = [t for t in shipped["tiers"] if t.get("replicas")]  # the llama.cpp tiers, not the embedder
    for tier in shipped["tiers"]:
        tier["replicas"] = tier["replicas"][:1]
        tier["replicas"][0]["url"] = f"http://127.0.0.1:{free_port()}/v1"
        tier["replicas"][0]["launch"]["n_threads"] = 1  # prices are per vCPU: one thread per server
    work = Path(tempfile.mkdtemp(prefix="bench-local-"))
    (work / "routes.yaml").write_text(yaml.safe_dump(shipped))
    routes = load_routes(work / "routes.yaml")
    counter = TokenCounters().for_spec("gguf:gemma3-270m-q4_k_m")
    prompts = {"short": ["Explain why tail latency matters for interactive chat."] * args.requests,
               "1k": [long_prompt(1000, counter.count)] * args.requests}
    children = start_children(routes, work / "logs")
    gateway_port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--routes", str(work / "routes.yaml"),
                                "--policies", str(ROOT / "policies/local.yaml"), "--port", str(gateway_port),
                                "--log-file", str(work / "requests.log")], stderr=subprocess.DEVNULL)
    try:
        asyncio.run(wait_healthy(children))
        time.sleep(1.0)
        tiers = [(t.name, t.replicas[0].url, t.replicas[0].model) for t in routes.tiers]
        rows = asyncio.run(measure(tiers, f"http://127.0.0.1:{gateway_port}/v1", prompts, args.max_tokens))
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=10)
        stop_children(children)
    startup = startup_seconds()
    report(rows, startup, counter.count(prompts["1k"][0]), args)


def report(rows: list[dict[str, Any]], startup: float, long_tokens: int, args: argparse.Namespace) -> None:
    load = os.getloadavg()
    print(f"# local tiers  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  nproc={os.cpu_count()}  "
          f"loadavg={load[0]:.2f}  requests={args.requests}  max_tokens={args.max_tokens}  1k prompt={long_tokens} tokens\n")
    print("| tier | prompt | path | TTFT p50 ms | TTFT max ms | TPOT p50 ms |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['tier']} | {r['prompt']} | {r['path']} | {r['ttft_p50_ms']:.1f} | {r['ttft_max_ms']:.1f} | "
              f"{r['tpot_p50_ms']:.2f} |")
    print("\n| tier | gateway added TTFT p50 (short / 1k) ms | decode tok/s | prefill tok/s (1k) | "
          "USD per 1M output | USD per 1M input |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    usd_per_vcpu_s = VM_USD_PER_HOUR / VCPUS / 3600
    for tier in dict.fromkeys(str(r["tier"]) for r in rows):
        pick = {(r["prompt"], r["path"]): r for r in rows if r["tier"] == tier}
        added = [float(pick[(k, "gateway")]["ttft_p50_ms"]) - float(pick[(k, "direct")]["ttft_p50_ms"])
                 for k in ("short", "1k")]
        decode = 1000 / float(pick[("short", "direct")]["tpot_p50_ms"])
        prefill = long_tokens / (float(pick[("1k", "direct")]["ttft_p50_ms"]) / 1000)
        print(f"| {tier} | {added[0]:+.1f} / {added[1]:+.1f} | {decode:.1f} | {prefill:.0f} | "
              f"{usd_per_vcpu_s / decode * 1e6:.3f} | {usd_per_vcpu_s / prefill * 1e6:.4f} |")
    print(f"\nstart-up of `gateway up` (routes/local.yaml, models built): {startup:.2f} s")
    print(f"prices: one server uses one of the VM's {VCPUS} vCPUs at ${VM_USD_PER_HOUR}/h; "
          "USD per 1M tokens = vCPU-seconds per token x vCPU price")


if __name__ == "__main__":
    main()
