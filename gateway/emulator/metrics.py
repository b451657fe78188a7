"""Prometheus text exposition with vLLM's metric names (what a gateway scrapes from vLLM)."""

from __future__ import annotations

from .engine import Engine

_GAUGES = (
    ("vllm:num_requests_running", "Number of requests in model execution batches."),
    ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage."),
    ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
)
_COUNTERS = (
    ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    ("vllm:prompt_tokens", "Number of prefill tokens processed."),
    ("vllm:generation_tokens", "Number of generation tokens processed."),
    ("vllm:num_preemptions", "Cumulative number of preemptions from the engine."),
)


def render_metrics(engine: Engine) -> str:
    """The /metrics body; counters carry the `_total` suffix as prometheus_client writes them."""
    label = '{model_name="' + engine.profile.model_name + '"}'
    gauges = (engine.num_running, engine.num_waiting, engine.kv_usage, engine.kv_usage)
    counters = (
        engine.prefix_cache.queries, engine.prefix_cache.hits, engine.stats.prompt_tokens,
        engine.stats.generation_tokens, engine.stats.preemptions,
    )
    lines: list[str] = []
    for (name, help_), value in zip(_GAUGES, gauges):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{label} {float(value)}"]
    for (name, help_), value in zip(_COUNTERS, counters):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter",
                  f"{name}_total{label} {float(value)}"]
    return "\n".join(lines) + "\n"
