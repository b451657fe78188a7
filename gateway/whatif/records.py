"""A request log line read back for replay: `Logged`, streamed from the log files one line at a time.

Only request lines of the model endpoints are replayed (chat, completions, embeddings and the protocols
translated to them); lines of other paths (admin, dashboard, count_tokens, ...) and other events are
skipped and counted. A line without the replay fields (`gateway.whatif.logline`, written before issue 40)
is `replayable` False: it keeps its recorded tier and is priced again, nothing re-decided.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import orjson

from gateway.accounting.reader import ReadStats, read_lines
from gateway.accounting.records import inference_line
from gateway.types import Endpoint

SHED = frozenset({"queue_full", "queue_timeout", "predicted_slo_miss", "no_replica_available", "overloaded"})
_EPOCH_DAYS: dict[int, date] = {}


class Logged:
    """One logged request, as the replay reads it (numbers only)."""

    __slots__ = ("arrival", "day", "tenant", "model", "endpoint", "difficulty", "quality", "tier", "backend",
                 "status", "error", "outcome", "stream", "prompt", "completion", "cached", "max_tokens", "asked",
                 "cache", "ttft_ms", "tpot_ms", "e2e_ms", "cost", "conversation", "sticky_conversation",
                 "sticky_user", "input_tokens", "input_chars", "outputs", "generated", "cacheable", "digest",
                 "decode_tps", "replayable", "worked", "session_route", "arm", "rerouted_from", "turn_parent",
                 "turn_current", "predicted_ttft_ms", "spilled_from", "spill_forecasts", "queue_ms")

    def __init__(self, obj: dict[str, Any]) -> None:
        self.arrival = _arrival(obj)
        self.day = day_of(self.arrival)
        tenant = obj.get("tenant") or "anonymous"
        if type(tenant) is not str:
            raise TypeError("tenant is not a string")  # a malformed line: counted as skipped
        self.tenant: str = tenant
        self.model: str | None = obj.get("model_requested")
        path = obj.get("path")
        self.endpoint: Endpoint = "embeddings" if path is not None and path.endswith("embeddings") else \
            "completions" if path in ("/v1/completions", "/completions") else "chat"
        self.difficulty: float | None = obj.get("difficulty")
        self.quality: dict[str, float] | None = obj.get("quality_predicted")
        self.tier: str | None = obj.get("tier")
        self.backend: str | None = obj.get("backend")
        self.status: int = obj.get("status") or 0
        self.error: str | None = obj.get("error")
        self.outcome: str = obj.get("outcome") or "ok"
        self.stream = bool(obj.get("stream"))
        self.prompt: int = obj.get("prompt_tokens") or 0
        self.completion: int = obj.get("completion_tokens") or 0
        self.cached: int = obj.get("cached_tokens") or 0
        self.max_tokens: int | None = obj.get("max_tokens")
        clamped = obj.get("max_tokens_clamped_from")
        self.asked: int | None = clamped if clamped is not None else self.max_tokens
        self.cache: str = obj.get("cache") or "off"
        self.ttft_ms: float | None = obj.get("ttft_ms")
        self.tpot_ms: float | None = obj.get("tpot_ms")
        self.e2e_ms: float = obj.get("e2e_ms") or 0.0
        self.queue_ms: float = obj.get("queue_ms") or 0.0  # in the admission queue
        self.cost: float = obj.get("cost_usd") or 0.0
        self.session_route: str | None = obj.get("session_route")
        self.arm: str | None = obj.get("arm")
        self.rerouted_from: str | None = obj.get("rerouted_from")
        self.replayable = obj.get("replay") is not None
        turn = obj.get("turn_keys") or {}  # replay 2 on: the turn's keys (none: the turn holds no session)
        self.turn_parent: str | None = turn.get("parent")
        self.turn_current: str | None = turn.get("current")
        self.predicted_ttft_ms: float | None = obj.get("predicted_ttft_ms")
        self.spilled_from: str | None = obj.get("spilled_from")
        spill = obj.get("spill")
        # what spill forecast for each tier it weighed, (tier, TTFT ms) (issue 39: logged when it spilled)
        self.spill_forecasts: tuple[tuple[str, float], ...] = () if not spill else tuple(
            (f["tier"], f["ttft_ms"]) for f in (spill.get("from"), spill.get("to"))
            if f and f.get("ttft_ms") is not None)
        sticky = obj.get("sticky") or {}
        self.sticky_conversation: int | None = sticky.get("conversation")
        self.sticky_user: int | None = sticky.get("user")
        reading = obj.get("reading") or {}
        self.input_tokens: int = reading.get("input_tokens") or max(1, self.prompt)
        self.input_chars: int = reading.get("input_chars") or 0
        self.outputs: int = reading.get("outputs") or 1
        self.generated: int = reading.get("generated") or self.outputs
        self.cacheable: str = reading.get("cacheable") or "never"
        self.digest: str | None = reading.get("digest")
        self.decode_tps: float | None = obj.get("decode_tps")
        # a backend worked on it (it is priced): the account stage's rule (priced_from set, or a cache hit)
        self.worked = obj.get("priced_from") is not None or (self.cost > 0 and self.cache not in ("hit", "semantic_hit"))

    @property
    def refused(self) -> str | None:
        """Why the request was not answered (its error code), None when it was (aborted streams included)."""
        if self.status < 400 or self.status == 499:
            return None
        return self.error or f"status_{self.status}"

    @property
    def served(self) -> bool:
        return 200 <= self.status < 300


def day_of(ts: float) -> date:
    index = int(ts // 86400)
    day = _EPOCH_DAYS.get(index)
    if day is None:
        day = _EPOCH_DAYS[index] = datetime.fromtimestamp(index * 86400, UTC).date()
    return day


def _arrival(obj: dict[str, Any]) -> float:
    arrival = obj.get("arrival_s")
    if isinstance(arrival, (int, float)):
        return float(arrival)
    return datetime.fromisoformat(obj["ts"]).timestamp()


@dataclass(slots=True)
class LogStats:
    """What the replay read: request lines kept, lines it skipped, and how many are replayed for price only."""

    read: ReadStats = field(default_factory=ReadStats)
    requests: int = 0
    price_only: int = 0  # lines without the replay fields (before issue 40): recorded tier, priced again
    other_paths: int = 0  # request lines outside the model endpoints (admin, dashboard, count_tokens, ...)
    skipped: int = 0  # not request lines (other events, shadow lines, text, malformed)


def read_logged(paths: Iterable[Path], stats: LogStats) -> Iterator[Logged]:
    """The model requests of `paths`, in file order, one at a time (memory flat in the number of lines)."""
    loads = orjson.loads
    for path in paths:
        for line in read_lines(path, stats.read):
            stats.read.lines += 1
            if b'"request"' not in line:
                stats.skipped += 1
                continue
            try:
                obj = loads(line)
                if not isinstance(obj, dict) or obj.get("event") != "request" or "ts" not in obj:
                    stats.skipped += 1
                    continue
                if not inference_line(obj):  # an edge line (dashboard, admin, ...; path null: a parser refusal)
                    stats.other_paths += 1
                    continue
                record = Logged(obj)
            except (orjson.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError):
                stats.skipped += 1
                continue
            stats.requests += 1
            if not record.replayable:
                stats.price_only += 1
            yield record


REORDER_S = 900.0  # a line is written when its request ends: this long after its arrival at most, assumed


def in_arrival_order(records: Iterable[Logged], horizon_s: float = REORDER_S) -> Iterator[Logged]:
    """`records` by arrival time: lines are written as requests end, so a slow request's line comes after lines
    of requests that arrived later. Held back until no earlier arrival can still come (a request lasts at most
    `horizon_s`): memory bounded by that much traffic, not by the log."""
    held: list[tuple[float, int, Logged]] = []
    order = itertools.count()
    for rec in records:
        heapq.heappush(held, (rec.arrival, next(order), rec))
        while held and held[0][0] < rec.arrival - horizon_s:
            yield heapq.heappop(held)[2]
    while held:
        yield heapq.heappop(held)[2]
