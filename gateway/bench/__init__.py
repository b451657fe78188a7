"""Serving benchmarks: workloads, arrival schedules, the load generator, vLLM-style summaries, and what
the scripts in bench/ run on (processes, CPU probes, gateway readers, reports).

    specs = sharegpt_requests(200, seed=0)
    run = asyncio.run(run_open_loop(Target(url, "auto", "sk-demo"), specs, poisson_offsets(200, 4.0)))
    print(format_table(summarize(run, parse_goodput(["ttft:500", "tpot:50"]))))

The pieces every benchmark shares, one of each:
    runner     the load generator: `closed_loop` / `open_loop` over any sender, `run_*_loop` over specs
    client     one request, timed: `send` (streaming), `send_json`
    summary    `percentile`, the vLLM-style summary; phases: named runs with the gateway's CPU
    cpu        `cpu_seconds`, `CpuProbe` (CPU per request), `OtherWork` (the machine's other load)
    procs      `Procs`, `free_port`, `wait_http`, pinning, `begin`; stack: emulators + a gateway
    readers    /metrics, Redis INFO, the gateway's JSON log
    report     `md_table`, result files, `machine`, `command_line`, `replace_marked` (a doc's section)
"""

from gateway.bench.arrivals import Arrivals, constant_offsets, offsets, offsets_within, poisson_offsets
from gateway.bench.client import RequestResult
from gateway.bench.report import ProgressBar, format_table, plot_latency_vs_load, replace_marked
from gateway.bench.runner import (
    RunResult,
    Target,
    closed_loop,
    open_loop,
    open_session,
    run_closed_loop,
    run_open_loop,
)
from gateway.bench.summary import parse_goodput, percentile, result_json, summarize, write_json
from gateway.bench.workload import (
    RequestSpec,
    interleave,
    sharegpt_conversations,
    sharegpt_requests,
    synthetic_requests,
)

__all__ = [
    "Arrivals", "ProgressBar", "RequestResult", "RequestSpec", "RunResult", "Target", "closed_loop",
    "constant_offsets", "format_table", "interleave", "offsets", "offsets_within", "open_loop", "open_session",
    "parse_goodput", "percentile", "plot_latency_vs_load", "poisson_offsets", "replace_marked", "result_json",
    "run_closed_loop", "run_open_loop", "sharegpt_conversations", "sharegpt_requests", "summarize",
    "synthetic_requests", "write_json",
]
