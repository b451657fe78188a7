"""Issue 31: the local tiers on llama.cpp's `llama-server` (parallel slots, continuous batching) against
llama-cpp-python's server (one request at a time per replica), both as `make run` runs them.

    .venv/bin/python bench/local_concurrency.py [--requests 24] [--max-tokens 64] [--stacks old,new,two-threads]
    .venv/bin/python bench/local_concurrency.py --sweep   # one small-q4 llama-server: --parallel x --threads
    .venv/bin/python bench/local_concurrency.py --stacks new,two-threads --background-spin   # a core wanted

Stacks, each on this machine's two cores:
- `new`: routes/local.yaml as shipped (two one-thread small-q4 llama-servers with two slots each);
- `old`: the same file with one slot per server, served as before issue 31 (the launcher of commit
  OLD_LAUNCHER: llama-cpp-python's `python -m llama_cpp.server`, one request at a time, the
  `llama-cpp-python[server]` extra; its libllama is this build's, so only the server differs);
- `two-threads`: the small tier as one llama-server with two threads and four slots (the fastest layout on
  two idle cores, and the one that collapses when anything else wants a core: docs/BENCHMARKS.md).
Every other tier as shipped. Each stack runs behind `gateway serve` with policies/local.yaml.
Load: a closed loop of C concurrent streams to one tier, each prompt unique (no prompt-cache reuse), answers
`max_tokens` long (`ignore_eos`, which llama-cpp-python's server ignores: its answers may end sooner; tokens/s
counts the tokens actually produced). Usage comes from each stream's usage chunk.
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
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

from gateway.bench.client import RequestResult, send
from gateway.bench.procs import free_port
from gateway.bench.report import ROOT
from gateway.bench.summary import percentile
from gateway.config.loader import load_routes
from gateway.local import models
from gateway.local.children import Child, llama_server_command, start_children, stop_children, wait_healthy
from gateway.config.routes import LlamaCppLaunch
from gateway.bench.ready import gateway_ready

OLD_LAUNCHER = "eb437bc"  # the last commit serving the local tiers with llama-cpp-python's server
TOPICS = ("lighthouses", "tides", "glaciers", "volcanoes", "deserts", "rivers", "forests", "comets", "bridges",
          "harbours", "canals", "mountains")


def prompt(i: int) -> str:
    return f"[{i}] Write a long story about {TOPICS[i % len(TOPICS)]} and the people who live near them."


async def closed_loop(url: str, model: str, concurrency: int, requests: int, max_tokens: int,
                      api_key: str | None) -> tuple[list[RequestResult], float]:
    """`requests` streams, `concurrency` at a time; (results, wall seconds)."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    todo = iter(range(requests))
    results: list[RequestResult] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in todo:
            body = orjson.dumps({"model": model, "messages": [{"role": "user", "content": prompt(i)}],
                                 "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                                 "stream_options": {"include_usage": True}})
            results.append(await send(session, f"{url}/chat/completions", body, headers))

    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return results, time.perf_counter() - start


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes `pids` used so far."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def summary(results: list[RequestResult], wall_s: float, server_cpu_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    tpots = [r.tpot_s * 1000 for r in ok if r.tpot_s is not None]
    tokens = sum(r.output_tokens for r in ok)
    return {"n": len(results), "ok": len(ok), "shed": sum(r.status == 503 for r in results),
            "tokens": tokens, "tok_s": tokens / wall_s, "wall_s": wall_s,
            "tok_per_cpu_s": tokens / server_cpu_s if server_cpu_s else float("nan"),
            "ttft_p50": statistics.median(ttfts) if ttfts else float("nan"),
            "ttft_p99": percentile(ttfts, 99) if ttfts else float("nan"),
            "tpot_p50": statistics.median(tpots) if tpots else float("nan")}


def old_command(launch: LlamaCppLaunch, alias: str, port: str) -> list[str]:
    """The launcher of commit OLD_LAUNCHER: llama-cpp-python's OpenAI server, one request at a time."""
    threads = str(launch.n_threads)
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(models.resolve(launch.model)),
            "--host", "127.0.0.1", "--port", port, "--model_alias", alias, "--chat_format", "gemma",
            "--n_ctx", str(launch.n_ctx), "--n_threads", threads, "--n_threads_batch", threads,
            "--interrupt_requests", "false"]


STACKS = ("old", "new", "two-threads")


def stack_routes(kind: str, work: Path) -> Path:
    """routes/local.yaml as `kind` serves it: `new` as shipped, `old` with one request at a time per server,
    `two-threads` with the small tier as one server of two threads and four slots."""
    if kind not in STACKS:
        raise SystemExit(f"--stacks: unknown stack {kind!r} (known: {', '.join(STACKS)})")
    shipped = yaml.safe_load((ROOT / "routes/local.yaml").read_text())
    for tier in shipped["tiers"]:
        if kind == "two-threads" and tier["name"] == "small-q4":
            tier["replicas"] = tier["replicas"][:1]
            tier["replicas"][0]["launch"] |= {"n_threads": 2, "parallel": 4}
            tier["slots_per_replica"] = 4
        for replica in tier.get("replicas", []):
            replica["url"] = f"http://127.0.0.1:{free_port()}/v1"
            if kind == "old":
                replica["launch"].pop("parallel", None)
                tier["slots_per_replica"] = 1  # one request at a time
    path = work / f"routes-{kind}.yaml"
    path.write_text(yaml.safe_dump(shipped))
    return path


def start_stack(kind: str, routes_path: Path, logs: Path) -> list[Child]:
    routes = load_routes(routes_path)
    if kind != "old":
        return start_children(routes, logs)
    children = []
    logs.mkdir(parents=True, exist_ok=True)
    for tier in routes.tiers:
        for replica in tier.replicas:
            assert isinstance(replica.launch, LlamaCppLaunch)
            with open(logs / f"{replica.name}.log", "ab") as out:
                process = subprocess.Popen(old_command(replica.launch, replica.model, str(replica.port)),
                                           start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
            children.append(Child(replica.name, process, f"{replica.url}/models"))
    return children


def run_stack(kind: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    routes_path = stack_routes(kind, work)
    routes = load_routes(routes_path)
    small = next(t for t in routes.tiers if t.name == "small-q4")
    slots = sum(r.launch.parallel if isinstance(r.launch, LlamaCppLaunch) else 1 for r in small.replicas)
    children = start_stack(kind, routes_path, work / f"logs-{kind}")
    port = free_port()
    gateway = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--routes", str(routes_path),
                                "--policies", str(ROOT / "policies/local.yaml"), "--port", str(port), "--no-redis",
                                "--log-file", str(work / f"requests-{kind}.log")],
                               stderr=(work / f"gateway-{kind}.err").open("wb"))
    url = f"http://127.0.0.1:{port}/v1"
    rows = []
    try:
        asyncio.run(wait_healthy(children, timeout_s=300))
        asyncio.run(gateway_ready(f"http://127.0.0.1:{port}"))
        asyncio.run(closed_loop(url, "small-q4", 2, 4, 8, "sk-demo"))  # warm-up
        for label, concurrency, requests in (("c=4", 4, args.requests), (f"3x capacity (c={3 * slots})", 3 * slots,
                                                                           max(args.requests, 6 * slots))):
            pids = [c.process.pid for c in children if c.name.startswith("small-q4")]
            before = cpu_s(pids)
            results, wall = asyncio.run(closed_loop(url, "small-q4", concurrency, requests, args.max_tokens,
                                                    "sk-demo"))
            rows.append({"stack": kind, "load": label, "slots": slots,
                         **summary(results, wall, cpu_s(pids) - before)})
            print(rows[-1], file=sys.stderr)
    finally:
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(timeout=30)
        stop_children(children)
    return rows


def sweep(args: argparse.Namespace) -> None:
    """One small-q4 llama-server, direct: aggregate tokens/s and TTFT at concurrency 4 per (parallel, threads)."""
    print("| --parallel | --threads | tokens/s (c=4) | tokens per server CPU-s | TTFT p50 ms | TTFT p99 ms | "
          "TPOT p50 ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for threads in (1, 2):
        for parallel in (1, 2, 4):
            launch = LlamaCppLaunch(kind="llama_cpp", model="gemma3-270m-q4_k_m", n_ctx=2048, n_threads=threads,
                                    parallel=parallel)
            port = str(free_port())
            process = subprocess.Popen(llama_server_command(launch, "m", port), start_new_session=True,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            child = Child("sweep", process, f"http://127.0.0.1:{port}/v1/models")
            try:
                asyncio.run(wait_healthy([child], timeout_s=120))
                url = f"http://127.0.0.1:{port}/v1"
                asyncio.run(closed_loop(url, "m", 2, 2, 8, None))
                before = cpu_s([process.pid])
                results, wall = asyncio.run(closed_loop(url, "m", 4, args.requests, args.max_tokens, None))
                s = summary(results, wall, cpu_s([process.pid]) - before)
            finally:
                stop_children([child])
            print(f"| {parallel} | {threads} | {s['tok_s']:.1f} | {s['tok_per_cpu_s']:.1f} | {s['ttft_p50']:.0f} | "
                  f"{s['ttft_p99']:.0f} | {s['tpot_p50']:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--background-spin", action="store_true",
                        help="one busy loop at nice 19 beside the stacks (anything else that wants a core)")
    parser.add_argument("--stacks", default="old,new", help=f"comma-separated, of {', '.join(STACKS)}")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"# local tiers, concurrency  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  nproc={os.cpu_count()}"
          f"  loadavg={load[0]:.2f}  requests={args.requests}  max_tokens={args.max_tokens}"
          f"{'  + a nice-19 busy loop' if args.background_spin else ''}\n")
    if args.sweep:
        sweep(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    spinner = (subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
               if args.background_spin else None)
    try:
        rows = [row for kind in args.stacks.split(",") for row in run_stack(kind, args, work)]
    finally:
        if spinner is not None:
            spinner.kill()
    print("| stack | load | slots | requests ok / shed | output tokens/s | tokens per server CPU-s | TTFT p50 ms | "
          "TTFT p99 ms | TPOT p50 ms |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['stack']} | {r['load']} | {r['slots']} | {r['ok']} / {r['shed']} | {r['tok_s']:.1f} | "
              f"{r['tok_per_cpu_s']:.1f} | {r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['tpot_p50']:.1f} |")
    base = next((r for r in rows if r["stack"] == "old" and r["load"] == "c=4" and r["tok_s"] > 0), None)
    for r in rows:
        if base is not None and r["stack"] != "old" and r["load"] == "c=4":
            print(f"aggregate tokens/s at c=4, {r['stack']} / old: {r['tok_s'] / base['tok_s']:.2f}x")


if __name__ == "__main__":
    main()
