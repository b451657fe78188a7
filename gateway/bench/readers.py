"""What a running gateway, its Redis and its log say: /metrics samples, Redis calls per op and
`INFO commandstats`, the JSON log's lines and events."""

from __future__ import annotations

import collections
import contextlib
import re
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson


def metrics_text(port: int, timeout_s: float = 5.0) -> str:
    """The /metrics page of the server on 127.0.0.1:`port`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
        return str(resp.read().decode())


def metric_values(port: int, pattern: re.Pattern[str]) -> dict[str, float]:
    """The /metrics samples on `port` that `pattern` matches (group 1 the name, group 2 the value)."""
    return {m.group(1): float(m.group(2)) for line in metrics_text(port).splitlines() if (m := pattern.match(line))}


def commandstats(client: Any) -> dict[str, int]:
    """Calls per command from INFO commandstats of a redis-py client (it parses {cmdstat_x: {calls: ...}})."""
    info = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items() if isinstance(v, dict)}


def diff_counts(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """after - before, per key, the keys that changed only."""
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] - before.get(k, 0)}


_METRIC = re.compile(r'^gateway_redis_(op_seconds_count|errors_total|op_seconds_bucket)'
                     r'\{(?:le="([^"]+)",)?op="([^"]+)"(?:,le="([^"]+)")?\}\s+([0-9.e+-]+)$')


@dataclass
class RedisOps:
    """The gateway's own count of its Redis calls, per op, from /metrics. Each RedisGuard.run that reaches
    Redis is one round trip (a pipeline or a script is one): `ok` answered within the guard's timeout,
    `failed` timed out or errored. Calls skipped while the guard holds Redis for down are counted nowhere
    (`up` is the gateway_redis_up gauge)."""

    ok: dict[str, float]
    failed: dict[str, float]
    buckets: dict[str, dict[str, float]]  # op -> le -> cumulative count of successful calls
    up: float | None

    def calls(self) -> dict[str, float]:
        return {k: self.ok.get(k, 0.0) + self.failed.get(k, 0.0) for k in sorted({*self.ok, *self.failed})}

    def minus(self, before: RedisOps) -> RedisOps:
        buckets = {op: {le: v - before.buckets.get(op, {}).get(le, 0.0) for le, v in b.items()}
                   for op, b in self.buckets.items()}
        return RedisOps(diff_counts(self.ok, before.ok), diff_counts(self.failed, before.failed), buckets, self.up)


def parse_redis_ops(text: str) -> RedisOps:
    """The RedisOps of a /metrics page."""
    ops = RedisOps({}, {}, {}, None)
    for line in text.splitlines():
        if line.startswith("gateway_redis_up "):
            ops.up = float(line.split()[1])
            continue
        m = _METRIC.match(line)
        if not m:
            continue
        kind, le, op, value = m.group(1), m.group(2) or m.group(4), m.group(3), float(m.group(5))
        if kind == "op_seconds_count":
            ops.ok[op] = ops.ok.get(op, 0.0) + value
        elif kind == "errors_total":
            ops.failed[op] = ops.failed.get(op, 0.0) + value
        elif le is not None:
            ops.buckets.setdefault(op, {})[le] = value
    return ops


def redis_ops(gateway_port: int) -> RedisOps:
    return parse_redis_ops(metrics_text(gateway_port))


def read_log(path: Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a gateway log file, one a line (other lines skipped; no file: none)."""
    with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
        for text in f:
            try:
                line = orjson.loads(text)
            except orjson.JSONDecodeError:
                continue
            if isinstance(line, dict):
                yield line


def log_events(path: Path) -> dict[str, Any]:
    """What the gateway's JSON log holds: events by name, and the request lines' `cache` field."""
    events: collections.Counter[str] = collections.Counter()
    cache: collections.Counter[str] = collections.Counter()
    for rec in read_log(path):
        events[str(rec.get("event"))] += 1
        if rec.get("event") == "request":
            cache[str(rec.get("cache"))] += 1
    return {"events": dict(events), "cache": dict(cache)}


def log_lines(path: Path, ids: set[str], timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """The request log lines of `ids`, by id (a handler a client left may log a moment after the client
    is done: waits up to `timeout_s` for all of them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = {str(line["request_id"]): line for line in read_log(path)
                 if line.get("event") == "request" and line.get("request_id") in ids}
        if len(lines) == len(ids) or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)


def wait_quiet(read: Callable[[], object], settle_s: float = 0.3, limit_s: float = 5.0) -> None:
    """Poll `read()` until it stops changing for `settle_s` (background writes done), at most `limit_s`."""
    deadline = time.monotonic() + limit_s
    last, since = read(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return
