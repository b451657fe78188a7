"""aiperf's figures beside the gateway's own for the same run (issue 41): read, join, compare, explain.

Three sources, one run:
  aiperf     profile_export_aiperf.json (its summary: what it prints) and profile_export.jsonl (one record per
             request, with the HTTP trace: the gateway's x-request-id response header joins it to a log line)
  log        the gateway's request log (`--log-file`): ttft_ms, tpot_ms, e2e_ms, prompt/completion tokens
  /metrics   gateway_ttft_seconds, gateway_tpot_seconds and gateway_requests, scraped before and after (the
             difference is the run): exact means from _sum/_count, a p50 only to a bucket's resolution

Definitions, side by side (what the comparison has to explain when they differ):
  TTFT       aiperf: from just before its request is sent to the first SSE event with content, as its worker
             reads it. Gateway: from the request's arrival at the edge (headers parsed) to the first content
             chunk read from the replica. The difference per request is the client's side: connect, send, the
             gateway's request parsing and response writing, and the client's own reading, on the same loopback.
  ITL        aiperf: (request latency - TTFT) / (output tokens - 1), output tokens counted by its tokenizer on
             the text. Gateway (tpot_ms): (end - first token) / (completion tokens - 1), completion tokens the
             replica's usage. Both averaged per request, then over requests.
  tokens     aiperf: input tokens = its tokenizer on the raw prompt text (BOS included, no chat template);
             output = its tokenizer on the answer text; it also records the usage the response carried. Gateway:
             the replica's usage (llama.cpp counts the templated prompt), else its own counts.
  tokens/s   aiperf: output tokens / benchmark duration (first request sent to last answer read). Gateway:
             completion tokens / (last request's end - first request's arrival), from the log.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.bench.summary import percentile

SERIES = ("gateway_ttft_seconds", "gateway_tpot_seconds", "gateway_e2e_seconds")
TARGET_PCT = 5.0  # issue 41: within 5 %, or the difference explained


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """One aiperf record: its timings (ms), token counts, and the gateway's id for it (None: no header)."""

    request_id: str | None
    ok: bool
    start_ns: int
    end_ns: int
    ttft_ms: float | None
    itl_ms: float | None
    latency_ms: float | None
    isl: int | None
    osl: int | None
    usage_prompt: int | None
    usage_completion: int | None
    connecting_ms: float
    sending_ms: float


def _value(metrics: Mapping[str, Any], name: str) -> float | None:
    item = metrics.get(name)
    value = item.get("value") if isinstance(item, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def tool_records(path: Path) -> list[ToolRecord]:
    """The per-request records of aiperf's profile_export.jsonl (profiling phase only)."""
    out = []
    for raw in path.read_bytes().splitlines():
        if not raw.strip():
            continue
        rec = orjson.loads(raw)
        meta, metrics = rec.get("metadata") or {}, rec.get("metrics") or {}
        if meta.get("benchmark_phase", "profiling") != "profiling":
            continue
        trace = rec.get("trace_data") or {}
        headers = {str(k).lower(): v for k, v in (trace.get("response_headers") or {}).items()}
        status = trace.get("response_status_code")
        out.append(ToolRecord(
            request_id=headers.get("x-request-id"), ok=not rec.get("error") and status in (None, 200),
            start_ns=int(meta.get("request_start_ns") or 0), end_ns=int(meta.get("request_end_ns") or 0),
            ttft_ms=_value(metrics, "time_to_first_token"), itl_ms=_value(metrics, "inter_token_latency"),
            latency_ms=_value(metrics, "request_latency"), isl=_int(_value(metrics, "input_sequence_length")),
            osl=_int(_value(metrics, "output_sequence_length")),
            usage_prompt=_int(_value(metrics, "usage_prompt_tokens")),
            usage_completion=_int(_value(metrics, "usage_completion_tokens")),
            connecting_ms=_value(metrics, "http_req_connecting") or 0.0,
            sending_ms=_value(metrics, "http_req_sending") or 0.0))
    return out


def tool_summary(path: Path) -> dict[str, float]:
    """aiperf's own summary (profile_export_aiperf.json), the figures compared, as it reported them."""
    data = orjson.loads(path.read_bytes())

    def stat(name: str, key: str = "avg") -> float:
        item = data.get(name)
        value = item.get(key) if isinstance(item, dict) else None
        return float(value) if isinstance(value, (int, float)) else math.nan

    return {
        "requests": stat("request_count"), "duration_s": stat("benchmark_duration"),
        "ttft_p50_ms": stat("time_to_first_token", "p50"), "ttft_mean_ms": stat("time_to_first_token"),
        "ttft_p99_ms": stat("time_to_first_token", "p99"),
        "itl_p50_ms": stat("inter_token_latency", "p50"), "itl_mean_ms": stat("inter_token_latency"),
        "latency_p50_ms": stat("request_latency", "p50"),
        "output_tps": stat("output_token_throughput"), "request_tps": stat("request_throughput"),
        "output_tokens": stat("total_osl"), "input_tokens": stat("total_isl"),
        "usage_output_tokens": stat("total_usage_completion_tokens"),
        "usage_input_tokens": stat("total_usage_prompt_tokens"),
    }


def gateway_figures(lines: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The same figures from the gateway's request log lines of the run (status 200 streams)."""
    ok = [line for line in lines if line.get("status") == 200]
    ttft = [float(line["ttft_ms"]) for line in ok if line.get("ttft_ms") is not None]
    tpot = [float(line["tpot_ms"]) for line in ok if line.get("tpot_ms") is not None]
    e2e = [float(line["e2e_ms"]) for line in ok if line.get("e2e_ms") is not None]
    starts = [float(line["arrival_s"]) for line in ok if line.get("arrival_s") is not None]
    ends = [float(line["arrival_s"]) + float(line["e2e_ms"]) / 1000 for line in ok
            if line.get("arrival_s") is not None and line.get("e2e_ms") is not None]
    span = max(ends) - min(starts) if starts and ends else math.nan
    out_tokens = float(sum(int(line.get("completion_tokens") or 0) for line in ok))
    return {
        "requests": float(len(ok)), "duration_s": span,
        "ttft_p50_ms": percentile(ttft, 50), "ttft_mean_ms": _mean(ttft), "ttft_p99_ms": percentile(ttft, 99),
        "itl_p50_ms": percentile(tpot, 50), "itl_mean_ms": _mean(tpot), "latency_p50_ms": percentile(e2e, 50),
        "output_tps": out_tokens / span if span > 0 else math.nan,
        "request_tps": len(ok) / span if span > 0 else math.nan,
        "output_tokens": out_tokens, "input_tokens": float(sum(int(line.get("prompt_tokens") or 0) for line in ok)),
    }


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# ---- /metrics: the run is the difference of two scrapes ----

@dataclass(frozen=True, slots=True)
class Histogram:
    """One histogram summed over its labels: cumulative bucket counts by upper bound, sum, count."""

    buckets: dict[float, float]
    sum: float
    count: float

    def minus(self, before: Histogram) -> Histogram:
        return Histogram({le: n - before.buckets.get(le, 0.0) for le, n in self.buckets.items()},
                         self.sum - before.sum, self.count - before.count)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: linear within the bucket the rank falls in (the +Inf bucket: its
        lower bound)."""
        if not self.count:
            return math.nan
        rank, lower, below = q * self.count, 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower
                return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 0.0)
            lower, below = le, n
        return lower

    def bucket_of(self, q: float) -> tuple[float, float]:
        """The (lower, upper] bounds of the bucket quantile `q` falls in: the resolution of `quantile`."""
        rank, lower = q * self.count, 0.0
        for le in sorted(self.buckets):
            if self.buckets[le] >= rank:
                return lower, le
            lower = le
        return lower, math.inf


@dataclass(frozen=True, slots=True)
class Scrape:
    histograms: dict[str, Histogram]
    requests: dict[str, float]  # gateway_requests_total by status

    def minus(self, before: Scrape) -> Scrape:
        return Scrape({name: h.minus(before.histograms[name]) if name in before.histograms else h
                       for name, h in self.histograms.items()},
                      {s: n - before.requests.get(s, 0.0) for s, n in self.requests.items()})


def parse_metrics(text: str, series: Iterable[str] = SERIES) -> Scrape:
    """The gateway's latency histograms (summed over tier and status labels) and requests by status."""
    wanted = set(series)
    buckets: dict[str, dict[float, float]] = {name: {} for name in wanted}
    sums: dict[str, float] = dict.fromkeys(wanted, 0.0)
    counts: dict[str, float] = dict.fromkeys(wanted, 0.0)
    requests: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "gateway_requests_total":
                status = sample.labels.get("status", "")
                requests[status] = requests.get(status, 0.0) + sample.value
                continue
            base, _, kind = name.rpartition("_")
            if base not in wanted:
                continue
            if kind == "bucket":
                le = float(sample.labels["le"])
                buckets[base][le] = buckets[base].get(le, 0.0) + sample.value
            elif kind == "sum":
                sums[base] += sample.value
            elif kind == "count":
                counts[base] += sample.value
    return Scrape({name: Histogram(buckets[name], sums[name], counts[name]) for name in wanted}, requests)


def metrics_figures(run: Scrape) -> dict[str, float]:
    """What /metrics says of the run: requests, TTFT and TPOT means (exact) and p50s (bucket-interpolated)."""
    ttft, tpot = run.histograms["gateway_ttft_seconds"], run.histograms["gateway_tpot_seconds"]
    lo, hi = ttft.bucket_of(0.5)
    return {"requests": run.requests.get("200", 0.0), "ttft_mean_ms": ttft.mean * 1000,
            "ttft_p50_ms": ttft.quantile(0.5) * 1000, "ttft_p50_bucket_lo_ms": lo * 1000,
            "ttft_p50_bucket_hi_ms": hi * 1000, "itl_mean_ms": tpot.mean * 1000,
            "itl_p50_ms": tpot.quantile(0.5) * 1000}


# ---- per request: aiperf's record and the gateway's line of the same request ----

def joined(records: Sequence[ToolRecord], lines: Mapping[str, Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per request seen by both (ok in aiperf, 200 in the log): aiperf minus gateway, for TTFT (ms), ITL (ms),
    output tokens (aiperf's tokenizer minus the replica's usage) and input tokens (the same)."""
    out = []
    for rec in records:
        line = lines.get(rec.request_id or "")
        if not rec.ok or line is None or line.get("status") != 200:
            continue
        row: dict[str, float] = {"connect_send_ms": rec.connecting_ms + rec.sending_ms}
        if rec.ttft_ms is not None and line.get("ttft_ms") is not None:
            row["ttft_ms"] = rec.ttft_ms - float(line["ttft_ms"])
        if rec.itl_ms is not None and line.get("tpot_ms") is not None:
            row["itl_ms"] = rec.itl_ms - float(line["tpot_ms"])
        if rec.latency_ms is not None and line.get("e2e_ms") is not None:
            row["latency_ms"] = rec.latency_ms - float(line["e2e_ms"])
        if rec.osl is not None:
            row["osl"] = rec.osl - int(line.get("completion_tokens") or 0)
        if rec.isl is not None:
            row["isl"] = rec.isl - int(line.get("prompt_tokens") or 0)
        if rec.usage_completion is not None:
            row["usage_completion"] = rec.usage_completion - int(line.get("completion_tokens") or 0)
        out.append(row)
    return out


def joined_summary(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """p50 and mean of each per-request difference, and how many requests were joined."""
    out: dict[str, float] = {"joined": float(len(rows))}
    for key in ("ttft_ms", "itl_ms", "latency_ms", "connect_send_ms", "osl", "isl", "usage_completion"):
        values = [r[key] for r in rows if key in r]
        out[f"{key}_p50"] = percentile(values, 50)
        out[f"{key}_mean"] = _mean(values)
        if key in ("osl", "isl", "usage_completion"):
            out[f"{key}_exact"] = float(sum(1 for v in values if v == 0))
    return out


# ---- the table ----

FIGURES = (  # key, label, unit digits
    ("requests", "requests completed", 0),
    ("ttft_p50_ms", "TTFT p50 (ms)", 1),
    ("ttft_mean_ms", "TTFT mean (ms)", 1),
    ("itl_p50_ms", "inter-token latency p50 (ms)", 2),
    ("itl_mean_ms", "inter-token latency mean (ms)", 2),
    ("output_tps", "output tokens/s", 1),
    ("output_tokens", "output tokens (total)", 0),
    ("input_tokens", "input tokens (total)", 0),
    ("duration_s", "duration (s)", 2),
)


def diff_pct(tool: float, gateway: float) -> float:
    """The gateway's figure against aiperf's, in % of aiperf's."""
    if math.isnan(tool) or math.isnan(gateway) or tool == 0:
        return math.nan
    return (gateway - tool) / tool * 100


def fmt(x: float, digits: int) -> str:
    if x is None or math.isnan(x):
        return "—"
    return f"{x:,.{digits}f}"


def rows(tool: Mapping[str, float], log: Mapping[str, float], metrics: Mapping[str, float]) -> list[list[str]]:
    """[figure, aiperf, gateway log, gateway /metrics, log vs aiperf] for each figure."""
    out = []
    for key, label, digits in FIGURES:
        t, g = tool.get(key, math.nan), log.get(key, math.nan)
        m = metrics.get(key, math.nan)
        cell = fmt(m, digits)
        if key == "ttft_p50_ms" and not math.isnan(m):
            cell += (f" (bucket {fmt(metrics['ttft_p50_bucket_lo_ms'], 0)}–"
                     f"{fmt(metrics['ttft_p50_bucket_hi_ms'], 0)})")
        d = diff_pct(t, g)
        out.append([label, fmt(t, digits), fmt(g, digits), cell, "—" if math.isnan(d) else f"{d:+.1f} %"])
    usage_out, usage_in = tool.get("usage_output_tokens", math.nan), tool.get("usage_input_tokens", math.nan)
    for label, value, key in (("output tokens, usage as aiperf received it", usage_out, "output_tokens"),
                              ("input tokens, usage as aiperf received it", usage_in, "input_tokens")):
        d = diff_pct(value, log.get(key, math.nan))
        shown = "—" if math.isnan(d) else f"{d:+.1f} %"
        out.append([label, fmt(value, 0), fmt(log.get(key, math.nan), 0), "—", shown])
    return out


HEADER = ("figure", "aiperf (its report)", "gateway: request log", "gateway: /metrics", "log vs aiperf")
