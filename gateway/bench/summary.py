"""Summaries named as `vllm bench serve` names them, goodput, and the JSON result file.

Latencies are reported in milliseconds: `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms`,
`p50_ttft_ms`, `p90_ttft_ms`, `p99_ttft_ms`, the same for `tpot`, `itl` and `e2el`. Percentiles
interpolate linearly (numpy's default, as vLLM). TPOT is averaged over requests with more than one
output token; ITL over every gap of every successful request. Goodput counts the successful
requests that meet every given SLO (`ttft:500 tpot:50 e2el:2000`, in ms) per second.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gateway.bench.client import RequestResult
from gateway.bench.runner import RunResult

PERCENTILES = (50.0, 90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")
Summary = dict[str, Any]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation), NaN for no values."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else math.nan


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0}; raises ValueError on a bad item."""
    slo: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"goodput SLO {item!r}: expected NAME:MS with NAME one of {', '.join(SLO_METRICS)}")
        try:
            slo[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if slo[name] < 0:
            raise ValueError(f"goodput SLO {item!r}: must be >= 0")
    return slo


def metric_ms(result: RequestResult, name: str) -> float:
    """One request's TTFT, TPOT (0 for a one-token answer) or E2E latency, in ms."""
    seconds = {"ttft": result.ttft_s, "tpot": result.tpot_s or 0.0, "e2el": result.e2e_s}[name]
    return math.inf if seconds is None else seconds * 1e3


def meets(result: RequestResult, slo: Mapping[str, float]) -> bool:
    return result.ok and all(metric_ms(result, k) <= v for k, v in slo.items())


def _stats(prefix: str, values_ms: Sequence[float], percentiles: Sequence[float]) -> Summary:
    arr = np.asarray(values_ms, dtype=np.float64)
    out: Summary = {f"mean_{prefix}_ms": float(arr.mean()) if arr.size else math.nan,
                    f"median_{prefix}_ms": percentile(values_ms, 50),
                    f"std_{prefix}_ms": float(arr.std()) if arr.size else math.nan}
    for q in percentiles:
        out[f"p{q:g}_{prefix}_ms"] = percentile(values_ms, q)
    return out


def summarize(run: RunResult, slo: Mapping[str, float] | None = None,
              percentiles: Sequence[float] = PERCENTILES) -> Summary:
    """The vLLM-style summary of one run."""
    ok = [r for r in run.results if r.ok]
    dur = run.duration_s or math.nan
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    s: Summary = {"completed": len(ok), "failed": len(run.results) - len(ok), "duration": run.duration_s,
                  "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
                  "request_throughput": len(ok) / dur, "output_throughput": out_tokens / dur,
                  "total_token_throughput": (in_tokens + out_tokens) / dur}
    if slo:
        s["request_goodput"] = sum(meets(r, slo) for r in ok) / dur
    s |= _stats("ttft", [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None], percentiles)
    s |= _stats("tpot", [r.tpot_s * 1e3 for r in ok if r.tpot_s is not None], percentiles)
    s |= _stats("itl", [x * 1e3 for r in ok for x in r.itl_s], percentiles)
    s |= _stats("e2el", [r.e2e_s * 1e3 for r in ok], percentiles)
    errors = collections.Counter(r.error or f"HTTP {r.status}" for r in run.results if not r.ok)
    s["errors"] = dict(errors.most_common(5))
    return s


def result_json(summary: Summary, run: RunResult, config: Mapping[str, Any],
                include_requests: bool = True) -> dict[str, Any]:
    """The result file's object: date, config, the summary's keys, and per-request arrays."""
    data: dict[str, Any] = {"date": dt.datetime.fromtimestamp(run.started_at, dt.timezone.utc).isoformat(),
                            **config, **summary}
    if include_requests:
        rs = run.results
        data |= {"ttfts": [r.ttft_s for r in rs], "itls": [r.itl_s for r in rs], "e2els": [r.e2e_s for r in rs],
                 "output_lens": [r.output_tokens for r in rs], "input_lens": [r.prompt_tokens for r in rs],
                 "start_times": [r.start_s for r in rs], "errors_by_request": [r.error for r in rs],
                 "headers": [r.headers for r in rs]}
    return data


def write_json(path: Path, data: Any) -> None:
    """Write `data` as indented JSON (NaN as null), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_nan_to_none(data), indent=1) + "\n")


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(v) for v in value]
    return value
