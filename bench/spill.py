"""Issue 39: spill under load, on against off in the same run, and the TTFT model's predictions against what was measured.

    .venv/bin/python bench/spill.py --stack local --concurrency 4,8 --requests 48      # make run's llama.cpp tiers
    .venv/bin/python bench/spill.py --stack emulator --capacity 2,3 --requests 240     # the emulator fleet

Each stack's backends start once (the routes file with free ports); for each load, a gateway with spill off then one
with spill on (the same policy file otherwise: policies/local.yaml or policies/emulator.yaml, spill per --slo-ms)
serve the same ShareGPT first turns (model 'auto', streamed, prompts of 4..--max-prompt tokens, answers of the
data's length capped at --max-tokens), a closed loop of C clients. Capacity (emulator): the fleet's slots (each
replica gets --slots slots_per_replica, so admission holds it there); C = capacity x the factor.

Per run: TTFT p50/p99 (ms), output tokens/s, goodput (share of requests served with TTFT within the SLO), the
share spilled, the predicted quality given up (mean over all requests, and over the spilled), and per tier the p50
of the predicted TTFT (the log line's predicted_ttft_ms: the chosen replica's, at admission, after any wait for a
slot) against the p50 measured from the same moment (ttft_ms - queue_ms).
Markdown on stdout (docs/BENCHMARKS.md, "Spill under load"), JSON rows on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
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
import yaml

from gateway.bench.client import RequestResult, send
from gateway.bench.procs import free_port
from gateway.bench.ready import gateway_ready
from gateway.bench.report import ROOT
from gateway.bench.summary import percentile
from gateway.bench.workload import RequestSpec, sharegpt_requests
from gateway.config.loader import load_routes
from gateway.local.children import start_children, stop_children, wait_healthy

STACKS = {"local": ("routes/local.yaml", "policies/local.yaml"),
          "emulator": ("routes/emulator.yaml", "policies/emulator.yaml")}


def stack_files(stack: str, work: Path, slo_ms: float, slots: int | None) -> tuple[Path, Path, Path]:
    """The routes (free ports; `slots` per replica on the emulator) and two policies: spill off, spill on."""
    routes_file, policy_file = STACKS[stack]
    routes = yaml.safe_load((ROOT / routes_file).read_text())
    for tier in routes["tiers"]:
        for replica in tier.get("replicas", []):
            replica["url"] = f"http://127.0.0.1:{free_port()}/v1"
        if slots is not None and tier.get("replicas"):
            tier["slots_per_replica"] = slots
    routes_path = work / "routes.yaml"
    routes_path.write_text(yaml.safe_dump(routes))
    policy = yaml.safe_load((ROOT / policy_file).read_text())
    policy.pop("spill", None)
    for tenant in policy.get("tenants", []):
        tenant.pop("spill", None)
    off, on = work / "policy-off.yaml", work / "policy-on.yaml"
    off.write_text(yaml.safe_dump(policy | {"spill": False}))
    on.write_text(yaml.safe_dump(policy | {"spill": {"ttft_slo_ms": slo_ms, "max_quality_loss": 0.02}}))
    return routes_path, off, on


async def closed_loop(url: str, specs: list[RequestSpec], concurrency: int, max_tokens: int) -> tuple[
        list[RequestResult], float]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-demo"}
    todo = iter(specs)
    results: list[RequestResult] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        for spec in todo:
            body = orjson.dumps({"model": "auto", "messages": list(spec.messages), "stream": True,
                                 "max_tokens": max(4, min(spec.max_tokens, max_tokens)),
                                 "stream_options": {"include_usage": True}})
            results.append(await send(session, f"{url}/chat/completions", body, headers))

    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900)) as session:
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return results, time.perf_counter() - start


def log_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for raw in path.read_bytes().splitlines():
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if line.get("event") == "request" and line.get("path", "").endswith("/chat/completions"):
            lines.append(line)
    return lines


def p(values: list[float], q: float) -> float | None:
    return None if not values else (statistics.median(values) if q == 50 else percentile(values, q))


def summarize(results: list[RequestResult], wall_s: float, lines: list[dict[str, Any]], slo_ms: float) -> dict[
        str, Any]:
    ok = [r for r in results if r.ok and r.ttft_s is not None]
    ttfts = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    tokens = sum(r.output_tokens for r in ok)
    spilled = [line for line in lines if line.get("spilled_from")]
    losses = [(line["spill"] or {}).get("quality_loss") or 0.0 for line in spilled]
    tiers: dict[str, dict[str, Any]] = {}
    for line in lines:
        if line.get("status") != 200 or line.get("ttft_ms") is None or line.get("predicted_ttft_ms") is None:
            continue
        row = tiers.setdefault(line["tier"], {"predicted": [], "measured": [], "queued": []})
        row["predicted"].append(line["predicted_ttft_ms"])  # the replica's TTFT, predicted at admission
        row["measured"].append(line["ttft_ms"] - (line.get("queue_ms") or 0.0))  # ... measured from then on
        row["queued"].append(line.get("queue_ms") or 0.0)
    per_tier = {name: {"n": len(row["measured"]), "predicted_p50_ms": p(row["predicted"], 50),
                       "measured_p50_ms": p(row["measured"], 50), "queue_p50_ms": p(row["queued"], 50)}
                for name, row in sorted(tiers.items())}
    return {"n": len(results), "ok": len(ok), "refused": sum(r.status in (429, 503) for r in results),
            "ttft_p50_ms": p(ttfts, 50), "ttft_p99_ms": p(ttfts, 99), "tok_s": tokens / wall_s,
            "goodput": sum(t <= slo_ms for t in ttfts) / len(results) if results else None,
            "spilled_share": len(spilled) / len(lines) if lines else 0.0,
            "quality_loss_mean": sum(losses) / len(lines) if lines else 0.0,
            "quality_loss_per_spill": sum(losses) / len(losses) if losses else 0.0,
            "tiers": per_tier, "wall_s": wall_s}


def serve(routes: Path, policy: Path, log: Path, err: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--routes", str(routes), "--policies",
                                str(policy), "--port", str(port), "--no-redis", "--log-file", str(log)],
                               cwd=ROOT, stderr=err.open("wb"))
    return process, f"http://127.0.0.1:{port}"


def run(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    slots = args.slots if args.stack == "emulator" else None
    routes_path, off, on = stack_files(args.stack, work, args.slo_ms, slots)
    routes = load_routes(routes_path)
    capacity = sum((t.slots_per_replica or 1) * len(t.replicas) for t in routes.tiers if t.replicas)
    loads = ([(f"c={c}", c) for c in args.concurrency] if args.stack == "local"
             else [(f"{x}x capacity (c={x * capacity})", x * capacity) for x in args.capacity])
    specs = sharegpt_requests(args.requests, seed=args.seed, max_prompt_tokens=args.max_prompt)
    children = start_children(routes, work / "logs")
    rows: list[dict[str, Any]] = []
    try:
        asyncio.run(wait_healthy(children, timeout_s=300))
        for label, concurrency in loads:
            for mode, policy in (("off", off), ("on", on)):
                log = work / f"requests-{concurrency}-{mode}.log"
                gateway, url = serve(routes_path, policy, log, work / f"gateway-{concurrency}-{mode}.err")
                try:
                    asyncio.run(gateway_ready(url))
                    asyncio.run(closed_loop(f"{url}/v1", specs[:4], 2, 8))  # warm-up: every tier learns a TTFT
                    results, wall = asyncio.run(closed_loop(f"{url}/v1", specs, concurrency, args.max_tokens))
                finally:
                    gateway.send_signal(signal.SIGTERM)
                    gateway.wait(timeout=60)
                lines = log_lines(log)[-len(specs):]
                rows.append({"stack": args.stack, "load": label, "spill": mode,
                             **summarize(results, wall, lines, args.slo_ms)})
                print(orjson.dumps(rows[-1]).decode(), file=sys.stderr)
    finally:
        stop_children(children)
    return rows


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def markdown(rows: list[dict[str, Any]], slo_ms: float) -> str:
    out = [f"| stack | load | spill | TTFT p50 ms | TTFT p99 ms | tokens/s | goodput (TTFT <= {slo_ms:g} ms) | "
           "spilled | quality given up (mean / per spill) | refused |", "|" + " --- |" * 10]
    for r in rows:
        out.append(f"| {r['stack']} | {r['load']} | {r['spill']} | {ms(r['ttft_p50_ms'])} | {ms(r['ttft_p99_ms'])} | "
                   f"{r['tok_s']:.1f} | {r['goodput']:.0%} | {r['spilled_share']:.0%} | "
                   f"{r['quality_loss_mean']:.4f} / {r['quality_loss_per_spill']:.4f} | {r['refused']} |")
    out += ["", "| stack | load | spill | tier | requests | predicted TTFT p50 ms | measured TTFT p50 ms (after the "
            "admission queue) | predicted / measured | admission queue p50 ms |", "|" + " --- |" * 9]
    for r in rows:
        for tier, t in r["tiers"].items():
            ratio = (t["predicted_p50_ms"] / t["measured_p50_ms"]) if t["measured_p50_ms"] else float("nan")
            out.append(f"| {r['stack']} | {r['load']} | {r['spill']} | {tier} | {t['n']} | "
                       f"{ms(t['predicted_p50_ms'])} | {ms(t['measured_p50_ms'])} | {ratio:.2f} | "
                       f"{ms(t['queue_p50_ms'])} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", choices=sorted(STACKS), default="local")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[4, 8])
    parser.add_argument("--capacity", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3])
    parser.add_argument("--slots", type=int, default=4, help="emulator: slots_per_replica (capacity)")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-prompt", type=int, default=300)
    parser.add_argument("--slo-ms", type=float, default=1500.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the logs in this folder")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        rows = run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(args, Path(tmp))
    print(markdown(rows, args.slo_ms))


if __name__ == "__main__":
    main()

