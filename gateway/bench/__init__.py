"""Serving benchmarks: workloads, arrival schedules, a streaming client, runners, vLLM-style summaries.

    specs = sharegpt_requests(200, seed=0)
    run = asyncio.run(run_open_loop(Target(url, "auto", "sk-demo"), specs, poisson_offsets(200, 4.0)))
    print(format_table(summarize(run, parse_goodput(["ttft:500", "tpot:50"]))))
"""

from gateway.bench.arrivals import Arrivals, constant_offsets, offsets, offsets_within, poisson_offsets
from gateway.bench.client import RequestResult
from gateway.bench.report import ProgressBar, format_table, plot_latency_vs_load, replace_marked
from gateway.bench.runner import RunResult, Target, open_session, run_closed_loop, run_open_loop
from gateway.bench.summary import parse_goodput, percentile, result_json, summarize, write_json
from gateway.bench.workload import (
    RequestSpec,
    interleave,
    sharegpt_conversations,
    sharegpt_requests,
    synthetic_requests,
)

__all__ = [
    "Arrivals", "ProgressBar", "RequestResult", "RequestSpec", "RunResult", "Target", "constant_offsets",
    "format_table", "interleave", "offsets", "offsets_within", "open_session", "parse_goodput", "percentile",
    "plot_latency_vs_load",
    "poisson_offsets", "replace_marked", "result_json", "run_closed_loop", "run_open_loop", "sharegpt_conversations",
    "sharegpt_requests", "summarize", "synthetic_requests", "write_json",
]
