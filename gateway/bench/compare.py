"""Side by side (bench/compare.py, issue 9): the paths to one emulator (direct, bare proxy, gateway with
the cache off and on, LiteLLM), each proxy process pinned; added latency at a fixed load, then the rate
search of each proxy (gateway.bench.sidebyside)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gateway.bench import litellm_env
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import Log, tree_cpu_seconds
from gateway.bench.procs import Procs, bare_proxy_argv, emulator_argv, free_port, wait_http
from gateway.bench.report import ROOT
from gateway.bench.runner import Target
from gateway.bench.sidebyside import BenchPath, RateSearch, added_latency, warm_up
from gateway.bench.workload import RequestSpec, sharegpt_requests

KEY = "sk-bench"


def gateway_files(folder: Path, emu_url: str, cache: bool) -> tuple[Path, Path]:
    """routes + policy for one gateway: tiers small and large (both the emulator), bands and
    classifier from policies/local.yaml, the cache on or off, one tenant without limits."""
    folder.mkdir(parents=True)
    routes = folder / "routes.yaml"
    routes.write_text(routes_yaml({"small": [("small-a", emu_url + "/v1")], "large": [("large-a", emu_url + "/v1")]}))
    local = yaml.safe_load((ROOT / "policies" / "local.yaml").read_text())["routing"]
    tiers = {"small-q4": "small", "large-f16": "large"}
    bands = [{**b, "tier": tiers[b["tier"]]} for b in local["bands"]]
    policy = json.loads(policy_yaml("small", [{"name": "bench", "key": KEY}], max_tokens=64))
    policy |= {"routing": {"classifier": local["classifier"], "bands": bands},
               "cache": {"enabled": cache, "mode": "deterministic", "ttl_s": 3600}}
    path = folder / "policy.yaml"
    path.write_text(json.dumps(policy, indent=1) + "\n")
    return routes, path


def start_paths(args: argparse.Namespace, tmp: Path, procs: Procs, rest: set[int] | None,
                proxy_cpu: int | None) -> list[BenchPath]:
    """Start the emulator and the proxies; the paths to measure, direct first."""
    logs = tmp / "logs"
    logs.mkdir()
    pin = {proxy_cpu} if proxy_cpu is not None else None
    port = free_port()
    emu = procs.start("emulator", emulator_argv(port, args.profile), rest, logs / "emulator.log")
    emu_url = f"http://127.0.0.1:{port}"
    wait_http(emu_url + "/v1/models", emu, "emulator")
    paths = [BenchPath("direct", Target(emu_url + "/v1", "emulated"))]
    port = free_port()
    bare = procs.start("bare", bare_proxy_argv(port, emu_url), pin, logs / "bare.log")
    wait_http(f"http://127.0.0.1:{port}/v1/models", bare, "bare proxy", method="POST")
    paths.append(BenchPath("bare proxy", Target(f"http://127.0.0.1:{port}/v1", "emulated"), bare.pid))
    for name, cache in (("gateway", False), ("gateway + cache", True)):
        routes, policy = gateway_files(tmp / name.replace(" + ", "-"), emu_url, cache)
        port = free_port()
        argv = [sys.executable, "-m", "gateway", "serve", "--routes", str(routes), "--policies", str(policy),
                "--host", "127.0.0.1", "--port", str(port), "--log-file", str(logs / f"{name[:7]}{cache:d}.jsonl")]
        gw = procs.start(name, argv, pin, logs / f"{name[:7]}{cache:d}.log")
        wait_http(f"http://127.0.0.1:{port}/healthz", gw, name, timeout_s=90)
        body = {"temperature": 0} if cache else {}
        paths.append(BenchPath(name, Target(f"http://127.0.0.1:{port}/v1", "auto", KEY, extra_body=body), gw.pid))
    if not args.no_litellm:
        port, pid = litellm_env.start(procs, logs, emu_url + "/v1", pin)
        name = f"LiteLLM {litellm_env.version()}"
        paths.append(BenchPath(name, Target(f"http://127.0.0.1:{port}/v1", "small"), pid))
    return paths


async def measure(args: argparse.Namespace, paths: list[BenchPath], log: Log) -> dict[str, Any]:
    """Warm-up, added latency at the fixed load, then the rate search of each proxy."""
    specs = [RequestSpec(s.messages, args.output_len, s.prompt_tokens, s.conversation_id)
             for s in sharegpt_requests(args.specs, seed=0, max_prompt_tokens=1024)]
    log(f"workload: {len(specs)} ShareGPT prompts, {args.output_len} output tokens; warm-up")
    for p in paths:
        await warm_up(p, specs if "cache" in p.name else specs[:64])
    log(f"added latency at {args.rate:g} req/s Poisson, {args.rounds} rounds x {args.seconds:g} s")
    rows = await added_latency(paths, specs, args.rate, args.seconds, args.rounds, tree_cpu_seconds, log)
    search: dict[str, dict[str, Any]] = {}
    probes: dict[tuple[str, float], dict[str, Any]] = {}
    rs = RateSearch(paths[0], specs, args.probe_s, rows[0]["p99_ttft_ms"], log, probes)
    for slo in [] if args.no_search else args.slo_ms:
        for p in paths[1:]:
            log(f"rate search: {p.name}, p99 added <= {slo:g} ms")
            found = await rs.run(p, start=args.rate, max_rate=args.max_rate, slo_ms=slo, bisect=args.bisect)
            search.setdefault(p.name, {})[f"{slo:g}"] = found
    result_probes = [row for row in probes.values()]
    return {"rows": rows, "search": search, "probes": result_probes}
