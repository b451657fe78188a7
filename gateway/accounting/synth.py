"""Synthetic request logs shaped like the gateway's, for the cost report's tests and benchmark.

A mix of tenants, tiers and outcomes (rejections, upstream errors, aborted streams, cache hits),
older lines without baseline pricing, operational events and a few malformed lines, written as
one file per UTC day with logrotate-style names: `requests.log.N.gz` (N >= 2), `requests.log.1`,
`requests.log`. Prices follow `cost.py`: tokens x price per million, rounded to a nano-dollar.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "wonka")
PRICES = {"small-int4": (0.05, 0.10), "medium-int8": (0.30, 0.60), "large-fp16": (2.50, 5.00)}  # $/Mtok in, out
TIERS = tuple(PRICES)
BASELINE = "large-fp16"
_CHUNK = 10_000
TTFT_MS = {"small-int4": 60.0, "medium-int8": 150.0, "large-fp16": 400.0}
TPOT_MS = {"small-int4": 8.0, "medium-int8": 18.0, "large-fp16": 45.0}
MALFORMED = (
    b'{"request_id": "r-trunc", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "co',
    b"Traceback (most recent call last): not a log line",
    b'{"event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": "acme", "tier": "x"}',
    b'{"event": "request", "ts": "2026-11-21T05:52:53.518+00:00", "tenant": 7, "tier": null, "status": 200,'
    b' "prompt_tokens": 1, "completion_tokens": 1, "ttft_ms": 1.0, "e2e_ms": 1.0, "cache": "off", "cost_usd": 0.1}',
)


def price(tier: str, prompt: int, completion: int) -> float:
    p_in, p_out = PRICES[tier]
    return round((prompt * p_in + completion * p_out) / 1_000_000, 9)


def _draws(rng: np.random.Generator, count: int) -> Iterator[tuple[Any, ...]]:
    """Per line: roll, tier, prompt, completion, ttft factor, hit ttft, error e2e, tenant, difficulty, stream, queue."""
    columns = (
        rng.random(count), rng.choice(len(TIERS), count, p=[0.55, 0.3, 0.15]), rng.lognormal(6.0, 0.8, count),
        rng.lognormal(5.0, 0.9, count), rng.lognormal(0.0, 0.4, count), rng.uniform(1.0, 4.0, count),
        rng.uniform(0.5, 30.0, count), rng.zipf(1.6, count), rng.random(count), rng.random(count),
        rng.exponential(2.0, count),
    )  # fmt: skip
    return zip(*(c.tolist() for c in columns), strict=True)


def _line(draw: tuple[Any, ...], ts: datetime, n: int) -> dict[str, Any]:
    """One request line from one row of `_draws`."""
    roll, tier_index, prompt_f, completion_f, ttft_factor, hit_ms, error_ms, zipf, difficulty, stream, queue = draw
    tier = TIERS[tier_index]
    prompt, completion = int(prompt_f) + 1, int(completion_f) + 1
    status, outcome, cache = 200, "ok", "miss"
    source: str | None = "backend"
    tier_or_none: str | None = tier
    ttft: float | None = TTFT_MS[tier] * ttft_factor
    if roll < 0.03:
        status, outcome, tier_or_none, completion, ttft, source = 429, "rejected", None, 0, None, None
    elif roll < 0.05:
        status, outcome, completion, ttft = 502, "upstream_error", 0, None
    elif roll < 0.07:
        status, outcome, completion = 499, "client_disconnected", completion // 3
    elif roll < 0.15:
        cache, source, ttft = "hit", "cache", hit_ms
    priced = price(tier, prompt, completion) if tier_or_none else 0.0
    cost = priced if outcome in ("ok", "client_disconnected") and cache == "miss" else 0.0
    avoided = priced if cache == "hit" else 0.0
    baseline = price(BASELINE, prompt, completion) if tier_or_none and status in (200, 499) else 0.0
    e2e = (ttft or error_ms) + (completion * TPOT_MS[tier] if cache == "miss" else 0.0)
    line: dict[str, Any] = {
        "request_id": f"req-{n:08d}", "ts": ts.isoformat(timespec="milliseconds"),
        "tenant": TENANTS[zipf % len(TENANTS)], "model_requested": "auto",
        "difficulty": round(difficulty, 4), "tier": tier_or_none,
        "backend": f"{tier}-0" if tier_or_none else None, "status": status, "outcome": outcome,
        "error": None if status in (200, 499) else outcome, "stream": stream < 0.6,
        "prompt_tokens": prompt, "completion_tokens": completion, "usage_source": source,
        "ttft_ms": None if ttft is None else round(ttft, 3), "tpot_ms": TPOT_MS[tier] if ttft else None,
        "e2e_ms": round(e2e, 3), "queue_ms": round(queue, 3), "attempts": int(status != 429),
        "finish_reason": "stop" if status == 200 else None, "cache": cache, "cost_usd": cost,
        "avoided_cost_usd": avoided, "baseline_cost_usd": baseline, "saved_usd": round(baseline - cost, 9),
        "level": "info", "event": "request",
    }  # fmt: skip
    if n % 20 == 7:  # a line from before baseline pricing was logged
        del line["baseline_cost_usd"], line["saved_usd"]
    return line


def lines_for_day(day: date, count: int, seed: int, first: int = 0, malformed_every: int = 50_000) -> Iterator[bytes]:
    """`count` lines for one UTC day: requests in time order, ~1% other events, 1 malformed in `malformed_every`."""
    rng = np.random.default_rng(seed)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    offsets = np.sort(rng.integers(0, 86_400_000, size=count)).tolist()
    for chunk in range(0, count, _CHUNK):
        draws = _draws(rng, min(_CHUNK, count - chunk))
        for i, draw in enumerate(draws, start=chunk):
            n = first + i
            if n % malformed_every == malformed_every - 1:
                yield MALFORMED[(n // malformed_every) % len(MALFORMED)]
            elif n % 97 == 13:
                yield orjson.dumps({"config_version": n, "level": "info", "event": "config reloaded"})
            else:
                yield orjson.dumps(_line(draw, start + timedelta(milliseconds=offsets[i]), n))


def write_logs(
    directory: Path, total_lines: int, days: int = 7, last_day: date = date(2026, 11, 21), malformed_every: int = 50_000
) -> list[Path]:
    """Write `total_lines` over `days` rotated files in `directory`; the paths, oldest first."""
    paths: list[Path] = []
    per_day, first = total_lines // days, 0
    for age in range(days - 1, -1, -1):
        count = per_day + (total_lines % days if age == 0 else 0)
        path = directory / ("requests.log" + (f".{age}" if age else "") + (".gz" if age >= 2 else ""))
        opener = gzip.open(path, "wb", compresslevel=1) if age >= 2 else open(path, "wb")
        with opener as f:
            batch: list[bytes] = []
            for line in lines_for_day(last_day - timedelta(days=age), count, age, first, malformed_every):
                batch.append(line)
                if len(batch) >= 10_000:
                    f.write(b"\n".join(batch) + b"\n")
                    batch.clear()
            if batch:
                f.write(b"\n".join(batch) + b"\n")
        paths.append(path)
        first += count
    return paths
