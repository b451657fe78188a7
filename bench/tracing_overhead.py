"""Tracing and dashboard cost (issue 20): gateway CPU per request with tracing off, on at 1 % and on at
100 % sampling, against a build without the tracing code path; then the dashboard's cost at 1,000 req/s.

    .venv/bin/python bench/tracing_overhead.py [--requests 20000] [--rounds 3] [--concurrency 32] [--stream]

Part 1 starts one emulator (profile instant), an OTLP/HTTP sink in this process (it reads and drops
the exports, answering 200), and four gateways (`gateway serve`, no Redis) pinned to the same CPU:
  untraced  a copy of the package with the tracing lines cut out of http.py, pipeline.py, context.py,
            upstream/attempt.py and stages/embed.py
  off       this build, no OTEL_* variables
  1%        OTEL_EXPORTER_OTLP_ENDPOINT + OTEL_TRACES_SAMPLER=parentbased_traceidratio, ARG 0.01
  100%      the same with parentbased_always_on
Each round sends the same closed-loop load through each gateway in turn (every other round in reverse
order); the gateway's CPU seconds
(all its threads, the exporter's included) / requests is CPU per request; the table has each variant's
median and minimum over the rounds and their difference to `untraced`. Part 1b measures the tracing
code path alone in process (far less noisy than part 1 on a busy machine).

Part 2, in process: the cost of recording one request into the dashboard's window and Prometheus
series, and of computing /dashboard/data.json from a window holding 15 minutes at 1,000 req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.phases import json_phase
from gateway.bench.procs import begin, emulator_argv, free_port, gateway_argv, wait_http
from gateway.bench.report import ROOT, command_line, load_line, md_table

API_KEY = "sk-bench"
# the tracing code path, cut out of a copy of the package for the `untraced` build: (file, text, replacement)
UNTRACED_CUTS = (
    ("pipeline.py", "        trace = ctx.trace if ctx.trace is not None and ctx.trace.recording else None\n"
                    "        if trace is not None:\n            return await self._run_traced(ctx, trace)\n", ""),
    ("http.py", "    if gateway.tracing is not None:\n        ctx.trace = gateway.tracing.start(request.headers, ctx)\n"
                "        ctx.finishers.append(ctx.trace.finish)\n", ""),
    ("context.py", "    trace: Trace | None = None  # the request's OpenTelemetry trace, when tracing is on\n", ""),
    ("upstream/attempt.py", "ctx.trace.headers() if ctx.trace is not None else None", "None"),
    ("stages/embed.py", "ctx.trace.headers() if ctx.trace is not None else None", "None"),
)
VARIANTS: dict[str, dict[str, str]] = {
    "untraced": {},
    "off": {},
    "1%": {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "100%": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


def untraced_copy(into: Path) -> Path:
    """A copy of the gateway package without the tracing code path; fails if a cut no longer matches."""
    package = into / "gateway"
    shutil.copytree(ROOT / "gateway", package, ignore=shutil.ignore_patterns("__pycache__"))
    for name, text, replacement in UNTRACED_CUTS:
        path = package / name
        source = path.read_text()
        if source.count(text) != 1:
            raise SystemExit(f"the untraced build no longer matches gateway/{name}: update UNTRACED_CUTS")
        path.write_text(source.replace(text, replacement))
    return into


async def otlp_sink() -> tuple[web.AppRunner, str, list[int]]:
    """An OTLP/HTTP endpoint that reads each export and drops it; counts the bytes."""
    received: list[int] = []

    async def traces(request: web.Request) -> web.Response:
        received.append(len(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", received


def start_gateways(run: Any, tmp: Path, emulator_url: str, sink: str) -> dict[str, tuple[int, int]]:
    """The four gateways: variant -> (pid, port)."""
    (tmp / "routes.yaml").write_text(routes_yaml({"t": [("t-0", f"{emulator_url}/v1")]}))
    (tmp / "policy.yaml").write_text(policy_yaml("t", [{"name": "bench", "key": API_KEY}]))
    stripped = untraced_copy(tmp / "untraced")
    started = {}
    for name, extra in VARIANTS.items():
        port = free_port()
        env = ["env", *(f"--unset={k}" for k in os.environ if k.startswith("OTEL_"))]  # env and taskset exec:
        if name not in ("untraced", "off"):  # the pid stays the gateway's
            env += [f"{k}={v}" for k, v in {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, "OTEL_SERVICE_NAME": "bench",
                                            **extra}.items()]
        if name == "untraced":
            env.append(f"PYTHONPATH={stripped}")
        argv = gateway_argv(tmp / "routes.yaml", tmp / "policy.yaml", port, tmp / f"requests-{port}.log", None,
                            run.gw_cpu)
        cwd = stripped if name == "untraced" else ROOT
        proc = run.procs.start(f"gateway {name}", env + argv, None, tmp / f"gateway-{port}.out", cwd=cwd)
        started[name] = (proc.pid, port)
    return started


async def measure(args: argparse.Namespace, gateways: dict[str, tuple[int, int]]) -> dict[str, list[float]]:
    body = orjson.dumps({"model": "t", "messages": [{"role": "user", "content": "Say hello in a few words."}],
                         "max_tokens": 16, "stream": args.stream})
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    per_request: dict[str, list[float]] = {name: [] for name in gateways}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for name, (pid, port) in gateways.items():  # warm-up: imports, first connections, JIT-free caches
            await json_phase(session, f"http://127.0.0.1:{port}/v1/chat/completions", headers, [body] * 2000,
                             args.concurrency, 120)
        for round_ in range(args.rounds):  # every other round in reverse order: no variant always runs first
            for name, (pid, port) in (reversed if round_ % 2 else iter)(list(gateways.items())):
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                await asyncio.sleep(0.5)  # the exporter's last batch (100%) is not billed to the next run
                phase = await json_phase(session, url, headers, [body] * args.requests, args.concurrency, 600,
                                         cpu_pid=pid)
                errors = sum(not s.ok for s in phase.samples) if not args.stream else 0
                assert phase.gateway_cpu_s is not None
                us = phase.gateway_cpu_s / len(phase.samples) * 1e6
                per_request[name].append(us)
                print(f"round {round_ + 1} {name:>8}: {us:7.1f} us CPU/request, "
                      f"{len(phase.samples) / phase.wall_s:6.0f} req/s, errors {errors}", flush=True)
    return per_request


def tracing_path_costs(requests: int = 4000) -> dict[str, float]:
    """In process, CPU (all threads) per request of the tracing code path alone: a request path whose
    stages are no-ops (the last one answers), run through its stage loop and finished; the spans are batched and OTLP-encoded by the exporter thread as for export, then dropped
    (no HTTP; a queue large enough that none is dropped). Much less noisy than part 1."""
    from dataclasses import fields

    from gateway.config.routes import TracingSettings
    from gateway.context import RequestContext
    from gateway.pipeline import RequestPath
    from gateway.testing import gateway_config, tier
    from gateway.tracing.otel import Tracing
    from gateway.types import JsonReply

    async def noop(self: Any, ctx: Any) -> None:
        ctx.queue_ms = 0.0

    async def answer(self: Any, ctx: Any) -> JsonReply:
        if ctx.trace is not None:
            ctx.trace.headers()
        return JsonReply(200, b"{}")

    names = [field.name for field in fields(RequestPath)][:-1]  # the stages (the accountant last)
    stages = {name: type(name, (), {"__call__": answer if name == names[-1] else noop})() for name in names}
    path = RequestPath(**stages, account=None)  # type: ignore[arg-type]
    config = gateway_config([tier("t", ["http://127.0.0.1:9/v1"])])
    environ = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
               "OTEL_BSP_MAX_QUEUE_SIZE": str(requests * 8)}
    costs = {}
    for name, ratio in (("off", None), ("1%", 0.01), ("100%", 1.0)):
        settings = TracingSettings(endpoint="http://127.0.0.1:9", sample_ratio=ratio)
        tracing = Tracing(settings, post=lambda body: None, environ=environ) if ratio else None

        async def run() -> None:
            for i in range(requests):
                ctx = RequestContext(f"r{i}", "chat", config, b"", None, time.perf_counter(), time.time())
                ctx.model_requested, ctx.route.tier, ctx.result.status = "t", config.tiers["t"], 200
                if tracing is not None:
                    ctx.trace = tracing.start({}, ctx)
                    ctx.finishers.append(ctx.trace.finish)
                await path.run(ctx)
                for finish in ctx.finishers:
                    finish(ctx)

        cpu0 = time.process_time()
        asyncio.run(run())
        if tracing is not None:
            tracing.shutdown()  # exports (encodes) what is queued
            assert tracing.dropped_spans == 0, tracing.dropped_spans
        costs[name] = (time.process_time() - cpu0) / requests * 1e6
    return costs


def dashboard_costs() -> dict[str, float]:
    """Recording one request (window + Prometheus series), and data.json from 15 minutes at 1,000 req/s."""
    from gateway.dashboard.snapshot import snapshot
    from gateway.dashboard.window import SLOT_S, SLOTS, LiveWindow, meets_slo
    from gateway.metrics import GatewayMetrics
    from gateway.context import RequestContext
    from gateway.testing import gateway_config, tier

    config = gateway_config([tier(name, ["http://127.0.0.1:9/v1"]) for name in ("small", "medium", "large")],
                            policy={"ttft_slo_ms": 500})
    tenant = next(iter(config.tenants_by_key_hash.values()))
    now = [time.time() - SLOT_S * SLOTS]
    window, metrics = LiveWindow(clock=lambda: now[0]), GatewayMetrics()
    contexts = []
    for i in range(300):
        ctx = RequestContext(f"r{i}", "chat", config, b"", None, 0.0, 0.0)
        ctx.route.tier, ctx.tenant = config.tiers[("small", "medium", "large")[i % 3]], tenant
        ctx.result.status, ctx.route.difficulty, ctx.result.cost_usd = (200, 200, 200, 503)[i % 4], (i % 97) / 97, 1e-5
        contexts.append(ctx)
    n = 1000 * SLOT_S * SLOTS  # 15 minutes at 1,000 req/s
    t0 = time.perf_counter()
    for i in range(n):
        now[0] += 0.001
        ctx = contexts[i % 300]
        ttft = 0.02 + (i % 200) / 1000
        good = meets_slo(ctx, ttft)
        window.record(ctx, ttft, 0.01 + (i % 50) / 5000, 1e-5, good)
        metrics.outcomes.observe(ctx, good, 1e-5)
    record_us = (time.perf_counter() - t0) / n * 1e6
    t0, calls = time.perf_counter(), 20
    for _ in range(calls):
        body = orjson.dumps(snapshot(window, config, {}, "up"))
    snapshot_ms = (time.perf_counter() - t0) / calls * 1e3
    return {"record_us": record_us, "snapshot_ms": snapshot_ms, "snapshot_bytes": len(body), "requests": n}


async def main(args: argparse.Namespace) -> tuple[dict[str, list[float]], int]:
    run = begin(args.no_pin)
    sink_runner, sink, received = await otlp_sink()
    try:
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            emulator_port = free_port()
            emulator = run.procs.start("emulator", emulator_argv(emulator_port), None, tmp / "emulator.out")
            wait_http(f"http://127.0.0.1:{emulator_port}/v1/models", emulator, "emulator")
            gateways = start_gateways(run, tmp, f"http://127.0.0.1:{emulator_port}", sink)
            procs = dict(run.procs.items)
            for name, (_, port) in gateways.items():
                await asyncio.to_thread(wait_http, f"http://127.0.0.1:{port}/healthz", procs[f"gateway {name}"],
                                        f"gateway {name}", "GET", 60)
            per_request = await measure(args, gateways)
    finally:
        run.procs.close()
        await sink_runner.cleanup()
    return per_request, sum(received)


def report(args: argparse.Namespace, per_request: dict[str, list[float]], exported: int, path: dict[str, float],
           dashboard: dict[str, float]) -> None:
    base, least = statistics.median(per_request["untraced"]), min(per_request["untraced"])
    rows = []
    for name, values in per_request.items():  # other work on the machine only adds: the minimum is the cleanest
        median = statistics.median(values)
        rows.append([name, f"{median:.1f}", f"{min(values):.1f}", " / ".join(f"{v:.1f}" for v in values),
                     "-" if name == "untraced" else f"{(median / base - 1) * 100:+.1f} %",
                     "-" if name == "untraced" else f"{(min(values) / least - 1) * 100:+.1f} %"])
    print()
    print(f"command: {command_line()}")
    print(load_line())
    mode = "streaming" if args.stream else "non-streaming"
    print(f"{args.rounds} rounds x {args.requests} {mode} requests per variant, concurrency {args.concurrency}; "
          f"OTLP bytes received: {exported}")
    print(md_table(["variant", "CPU us/request (median)", "(min)", "per round", "median vs untraced",
                    "min vs untraced"], rows, "--- ---: ---: ---: ---: ---:"))
    print("\nthe tracing code path alone, in process (CPU us/request; % of the untraced gateway's median above):")
    print(md_table(["variant", "CPU us/request", "added over off", "% of untraced"],
                   [[name, f"{us:.1f}", f"{us - path['off']:.1f}", f"{(us - path['off']) / base * 100:+.1f} %"]
                    for name, us in path.items()], "--- ---: ---: ---:"))
    share = dashboard["record_us"] * 1000 / 1e6
    print(f"\ndashboard: recording a request {dashboard['record_us']:.2f} us (window + Prometheus series) = "
          f"{share * 100:.2f} % of a core at 1,000 req/s; data.json over a full window "
          f"({dashboard['requests']:,} requests in 15 min) {dashboard['snapshot_ms']:.1f} ms, "
          f"{dashboard['snapshot_bytes'] / 1024:.0f} KiB (one viewer refreshing every 3 s: "
          f"{dashboard['snapshot_ms'] / 3000 * 100:.2f} % of a core)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--no-pin", action="store_true")
    arguments = parser.parse_args()
    measured, exported_bytes = asyncio.run(main(arguments))
    report(arguments, measured, exported_bytes, tracing_path_costs(), dashboard_costs())
