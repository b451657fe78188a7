"""One request log line -> a validated `Record`, or the reason it was skipped.

A `shadow` line (a shadow comparison's reference and judge calls: gateway.experiments.shadow) is spend too,
the gateway's own, billed to no tenant: it becomes `shadow_only` records carrying `shadow` dollars, one for
the reference tier (`to_tier`: `shadow_cost_usd` less `judge_cost_usd`) and, when a judge graded the pair, one
for the judge tier (`judge_cost_usd`), under the tenant whose request was compared.

A request line of another endpoint than inference (dashboard polls, static files, admin, count_tokens, unknown
paths, parser refusals: gateway.edge.accounted's edge lines, cost 0) becomes an `edge` record: the report counts it
apart (`other`), never as a request (`inference_line`).

Money is read from the line's own text. orjson parses the structure (and catches broken JSON);
for each money field the numeric token is then located in the raw bytes and handed to
`Decimal` as written, so totals are the exact decimal sum of what the gateway logged, not of
binary floats. The token is cross-checked against orjson's float (`float(text) == value`); if
the check fails (a duplicated key, say) the field falls back to `Decimal(repr(value))`, which for
orjson-written lines is the same number anyway (both print the shortest round-tripping digits).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

import orjson

HIT_STATES = frozenset({"hit", "semantic_hit"})
# The request path's endpoints (gateway.http): a line of one of these paths, or with no `path` key at all (written
# before issue 37 added it, when only these endpoints logged), is an inference request. Any other line (`path` of
# the dashboard, admin, count_tokens, feedback, models, static files, an unknown path; null: a request aiohttp's
# parser refused) is an edge line (gateway.edge.accounted): cost 0, counted apart from the requests.
INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                             "/v1/embeddings"})
_ZERO = Decimal(0)
_MISSING: Any = object()
_NUMBERS = (int, float)
_LATENCY = (int, float, type(None))
_MONEY = ("cost_usd", "avoided_cost_usd", "baseline_cost_usd", "saved_usd", "shadow_cost_usd", "judge_cost_usd")
_NEEDLES = {key: b'"' + key.encode() + b'"' for key in _MONEY}
_NUMBER = re.compile(rb"[ \t]*:[ \t]*(-?[0-9][0-9.eE+-]*)")


class Skip(Enum):
    """Why a line was not counted; the first three are 'malformed' (a line that looks like a log line and is
    broken); TEXT lines do not start with `{` and are skipped apart."""

    NOT_JSON = "not JSON"
    MISSING_FIELD = "missing field"
    WRONG_TYPE = "wrong type"
    OTHER_EVENT = "other event"
    BLANK = "blank"
    TEXT = "text"  # not a JSON object at all: console output (a banner, a traceback) mixed into the log


@dataclass(slots=True)
class Record:
    """The fields of a request line that the cost report uses."""

    day: date  # UTC
    tenant: str
    tier: str | None
    status: int
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float | None
    e2e_ms: float | None
    cache_hit: bool
    cost: Decimal
    avoided: Decimal
    baseline: Decimal
    saved: Decimal
    priced_baseline: bool  # the line carried baseline_cost_usd or saved_usd
    session: str | None = None  # the conversation's session id (a sticky-tier session), when it had one
    shadow: Decimal = _ZERO  # a shadow comparison's spend on this tier (shadow_only records)
    shadow_only: bool = False  # from a `shadow` line: no request of the tenant's, only the gateway's spend
    edge: bool = False  # a line of another endpoint than inference (`inference_line`): counted apart

    @property
    def served(self) -> bool:
        return 200 <= self.status < 300


class Malformed(Exception):
    """A request line that cannot be used; `reason` says which kind, `field` which field."""

    def __init__(self, reason: Skip, field: str) -> None:
        super().__init__(f"{reason.value}: {field}")
        self.reason = reason
        self.field = field


def parse_line(line: bytes) -> Record | tuple[Record, ...] | Skip:
    """The record a line holds (a shadow line: one or two), or why it holds none (malformed, other event or
    blank)."""
    if line[:1] != b"{":  # log lines start with `{`: this test first, for the million lines that do
        if not line.strip():
            return Skip.BLANK
        if console_text(line):
            return Skip.TEXT
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return Skip.NOT_JSON
    if type(obj) is not dict:
        return Skip.NOT_JSON
    event = obj.get("event")
    if event != "request":
        if event != "shadow":
            return Skip.OTHER_EVENT
        try:
            return _shadow(obj, line)
        except Malformed as exc:
            return exc.reason
    try:
        return _record(obj, line)
    except Malformed as exc:
        return exc.reason


def inference_line(obj: dict[str, Any]) -> bool:
    """Whether a request line is an inference request's: its `path` is one of INFERENCE_PATHS, or it has none
    (a line from before the field); False for an edge line (another endpoint, or `path: null`)."""
    path = obj.get("path", _MISSING)
    return path is _MISSING or (type(path) is str and path in INFERENCE_PATHS)


def console_text(line: bytes) -> bool:
    """A line that is no JSON object at all (a banner, a traceback: console output captured with the log)."""
    stripped = line.strip()
    return bool(stripped) and stripped[:1] != b"{"


def explain(line: bytes) -> str:
    """A one-phrase reason for a malformed line, naming the field (for the report's examples)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"not JSON ({exc})"
    if type(obj) is not dict:
        return "not JSON (not an object)"
    try:
        _shadow(obj, line) if obj.get("event") == "shadow" else _record(obj, line)
    except Malformed as exc:
        return str(exc)
    return "ok"


def _shadow(obj: dict[str, Any], line: bytes) -> tuple[Record, ...]:
    """A shadow line's spend: the reference tier's record, and the judge tier's when a judge graded the pair."""
    ts, tenant, to_tier, judge = obj.get("ts"), obj.get("tenant"), obj.get("to_tier"), obj.get("judge_tier")
    for key, value in (("ts", ts), ("tenant", tenant), ("to_tier", to_tier)):
        if value is None:
            raise Malformed(Skip.MISSING_FIELD, key)
        if type(value) is not str:
            raise Malformed(Skip.WRONG_TYPE, key)
    if judge is not None and type(judge) is not str:
        raise Malformed(Skip.WRONG_TYPE, "judge_tier")
    total = _money(obj, line, "shadow_cost_usd")
    if total is None:
        raise Malformed(Skip.MISSING_FIELD, "shadow_cost_usd")
    judged = (_money(obj, line, "judge_cost_usd") or _ZERO) if judge is not None else _ZERO
    judged = min(judged, total)
    day = _day(str(ts))

    def spend(tier: str, usd: Decimal) -> Record:
        return Record(day, str(tenant), tier, 200, 0, 0, None, None, False, _ZERO, _ZERO, _ZERO, _ZERO, True,
                      None, usd, True)

    reference = spend(str(to_tier), total - judged)
    return (reference, spend(judge, judged)) if judge is not None and judged else (reference,)


def _record(obj: dict[str, Any], line: bytes) -> Record:
    """Fast path: check every field in one expression; on failure, `_diagnose` names the culprit."""
    get = obj.get
    ts, tenant, tier, status = get("ts"), get("tenant"), get("tier", _MISSING), get("status")
    prompt, completion, cache = get("prompt_tokens"), get("completion_tokens"), get("cache")
    ttft, e2e = get("ttft_ms", _MISSING), get("e2e_ms", _MISSING)
    if not (
        type(ts) is str and type(tenant) is str and (tier is None or type(tier) is str) and type(status) is int
        and type(prompt) is int and prompt >= 0 and type(completion) is int and completion >= 0
        and type(cache) is str and (ttft is None or _is_latency(ttft)) and (e2e is None or _is_latency(e2e))
    ):  # fmt: skip
        raise _diagnose(obj)
    cost = _money(obj, line, "cost_usd")
    if cost is None:
        raise Malformed(Skip.MISSING_FIELD, "cost_usd")
    baseline, saved = _money(obj, line, "baseline_cost_usd"), _money(obj, line, "saved_usd")
    priced = baseline is not None or saved is not None
    if baseline is None:
        baseline = cost + saved if saved is not None else _ZERO
    if saved is None:
        saved = baseline - cost if priced else _ZERO
    return Record(
        _day(ts), tenant, tier, status, prompt, completion, ttft, e2e, cache in HIT_STATES,
        cost, _money(obj, line, "avoided_cost_usd") or _ZERO, baseline, saved, priced,
        session if type(session := get("session")) is str else None, edge=not inference_line(obj),
    )  # fmt: skip


def _is_latency(value: Any) -> bool:
    return type(value) in _NUMBERS and 0 <= value < math.inf


def _diagnose(obj: dict[str, Any]) -> Malformed:
    """The first missing or mistyped field of a line the fast path refused."""
    kinds: dict[str, tuple[type, ...]] = {
        "ts": (str,), "tenant": (str,), "tier": (str, type(None)), "status": (int,), "prompt_tokens": (int,),
        "completion_tokens": (int,), "cache": (str,), "ttft_ms": _LATENCY, "e2e_ms": _LATENCY,
    }  # fmt: skip
    for key, allowed in kinds.items():
        value = obj.get(key, _MISSING)
        if value is _MISSING:
            return Malformed(Skip.MISSING_FIELD, key)
        if type(value) not in allowed or (type(value) in _NUMBERS and not 0 <= value < math.inf):
            return Malformed(Skip.WRONG_TYPE, key)
    return Malformed(Skip.WRONG_TYPE, "?")


def _day(ts: str) -> date:
    try:
        moment = datetime.fromisoformat(ts)
    except ValueError:
        raise Malformed(Skip.WRONG_TYPE, "ts") from None
    if moment.tzinfo is not None and moment.utcoffset():
        moment = moment.astimezone(UTC)
    return moment.date()


def _money(obj: dict[str, Any], line: bytes, key: str) -> Decimal | None:
    """The field's exact decimal value from its token text; None if absent or null."""
    value = obj.get(key)
    if value is None:
        return None
    if type(value) not in _NUMBERS or not -math.inf < value < math.inf or (value < 0 and key != "saved_usd"):
        raise Malformed(Skip.WRONG_TYPE, key)
    if value == 0:
        return _ZERO
    at = line.find(_NEEDLES[key])
    match = _NUMBER.match(line, at + len(_NEEDLES[key])) if at >= 0 else None
    if match is not None and float(match[1]) == value:
        return Decimal(match[1].decode())
    return Decimal(repr(value))
