"""OTLP/HTTP export of finished spans: a bounded queue the request path appends to (never blocking,
dropping and counting when full), and one thread that batches the spans, encodes them as an OTLP
ExportTraceServiceRequest (protobuf, written here by hand: no SDK span objects, no protobuf runtime; or
OTLP/JSON, gateway.tracing.otlp_json) and POSTs them to <endpoint>/v1/traces (gateway.tracing.otlp_http).
Configured like the SDK's BatchSpanProcessor and OTLP/HTTP exporter, from the same OTEL_* variables
(gateway.tracing.settings).

A span is a plain tuple (`SpanRecord`); attributes are a tuple of keys and a tuple of values (None:
left out), so the request path builds no dict and the encoder caches what repeats. A string that UTF-8
cannot encode (a lone surrogate) is written with U+FFFD in its place, as protobuf strings must be valid
UTF-8; a span that cannot be encoded at all is left out of its batch and counted, the others go."""

from __future__ import annotations

import atexit
import re
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any, Protocol, TypeVar

import structlog

from gateway.backends.urls import redact_url
from gateway.tracing.otlp_http import ExportFailed, HttpPoster, PartiallyRejected
from gateway.tracing.settings import ExportSettings

log = structlog.get_logger("gateway.tracing")

# (trace_id, span_id, parent_span_id (0: none), flags (OTLP Span.flags), trace_state, name, kind,
#  start ns, end ns, attribute keys, attribute values (None: absent), events ((name, ns), ...) or None,
#  error message or None)
SpanRecord = tuple[int, int, int, int, str, str, int, int, int, tuple[str, ...], tuple[Any, ...],
                   tuple[tuple[str, int], ...] | None, str | None]

K = TypeVar("K")
V = TypeVar("V")
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3
FLAG_SAMPLED = 0x01  # the W3C trace flags in the low byte
FLAG_HAS_IS_REMOTE, FLAG_IS_REMOTE = 0x100, 0x200  # SpanFlags: whether the parent is in another process
STATUS_ERROR = 2
_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8(text: str) -> bytes:
    """text as UTF-8, each lone surrogate (which UTF-8 cannot encode) replaced by U+FFFD."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return valid_text(text).encode()


def valid_text(text: str) -> str:
    """text with each lone surrogate replaced by U+FFFD (the replacement character)."""
    return _SURROGATE.sub("\ufffd", text)


class SpanEncoder(Protocol):
    """Encodes a batch of spans as one export request's body (protobuf or JSON); counts the spans it had to
    leave out."""

    unencodable: int

    def request(self, spans: Iterable[SpanRecord]) -> bytes: ...


# ---- protobuf encoding (proto3 wire format of opentelemetry/proto/{trace,common,resource} v1) ----

_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_span_id = struct.Struct(">HQ").pack  # a tag's two bytes (0x12 0x08: span_id, 0x22 0x08: parent) and the id
_pack_times = struct.Struct("<BBBQBQ").pack  # kind (6), start (7, fixed64), end (8, fixed64)
_pack_flags = struct.Struct("<HI").pack  # flags (16, fixed32): tag 0x85 0x01
_ONE_BYTE = [bytes((n,)) for n in range(128)]
_INT64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    if n < 128:
        return _ONE_BYTE[n]
    if n < 16384:
        return bytes(((n & 127) | 128, n >> 7))
    out = bytearray()
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def any_value(value: Any) -> bytes:
    """An AnyValue: string 1, bool 2, int 3, double 4, array 5 (values 1), bytes 7."""
    kind = type(value)
    if kind is str:
        return _delimited(b"\x0a", utf8(value))
    if kind is float:
        return b"\x21" + _pack_double(value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + varint(value & _INT64)
    if isinstance(value, (list, tuple)):
        return _delimited(b"\x2a", b"".join(_delimited(b"\x0a", any_value(item)) for item in value))
    if isinstance(value, (bytes, bytearray)):
        return _delimited(b"\x3a", bytes(value))
    return any_value(plain_value(value))


def plain_value(value: Any) -> str | bool | int | float:
    """A value of another type as the attribute value it stands for: a str, bool or int subclass (enums)
    as its base type, a number-like (numpy scalars and the like) as a float, anything else as its str()."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


class _Plan:
    """How one tuple of attribute keys is encoded: the values of its `stable` keys (few distinct values
    each) as one cached block per combination, the others one by one."""

    __slots__ = ("keys", "stable_keys", "stable", "varying", "blocks")

    def __init__(self, keys: tuple[str, ...], stable: frozenset[str]) -> None:
        self.keys = keys  # (held: its id() is the plan's key)
        indices = [i for i, key in enumerate(keys) if key in stable]
        self.stable_keys = tuple(keys[i] for i in indices)
        self.stable: Callable[[tuple[Any, ...]], Any] | None = (
            None if not indices else itemgetter(*indices) if len(indices) > 1 else lambda values: (values[indices[0]],))
        self.varying = tuple((i, key) for i, key in enumerate(keys) if key not in stable)
        self.blocks: dict[Any, bytes] = {}


class Encoder:
    """ExportTraceServiceRequest bytes for a batch of spans of one resource and one scope. Everything that
    repeats from span to span is encoded once and cached (bounded): keys, names, events' names, blocks of
    the `stable` attributes, short strings; a double is its key's head and 8 bytes, an int its key's head
    for the varint's length and the varint."""

    CACHE_LIMIT = 4096

    def __init__(self, resource: Mapping[str, Any], scope: str, stable: Iterable[str] = ()) -> None:
        self._stable = frozenset(stable)
        self._plans: dict[int, _Plan] = {}
        self._keys: dict[str, bytes] = {}  # KeyValue.key (1)
        self._doubles: dict[str, bytes] = {}  # Span.attributes (9) up to the double's 8 bytes
        self._ints: dict[str, list[bytes]] = {}  # ... up to the varint, by the varint's length
        self._strings: dict[tuple[str, Any], bytes] = {}  # whole Span.attributes (9) fields
        self._names: dict[str, bytes] = {}
        self._events: dict[str, tuple[bytes, bytes]] = {}  # Span.events (11) around the time
        self.unencodable = 0  # spans left out of their batch: they could not be encoded
        attributes = b"".join(_delimited(b"\x0a", self._key_value(k, v)) for k, v in resource.items())
        self._resource = _delimited(b"\x0a", attributes)  # ResourceSpans.resource (Resource.attributes 1)
        self._scope = _delimited(b"\x0a", _delimited(b"\x0a", utf8(scope)))  # ScopeSpans.scope (name 1)

    def _cached(self, cache: dict[K, V], key: K, encoded: V) -> V:
        if len(cache) >= self.CACHE_LIMIT:
            cache.clear()
        cache[key] = encoded
        return encoded

    def _key(self, key: str) -> bytes:
        prefix = self._keys.get(key)
        return prefix if prefix is not None else self._cached(self._keys, key, _delimited(b"\x0a", utf8(key)))

    def _key_value(self, key: str, value: Any) -> bytes:
        return self._key(key) + _delimited(b"\x12", any_value(value))

    def _double_head(self, key: str) -> bytes:
        key_value = self._key_value(key, 0.0)
        return self._cached(self._doubles, key, b"\x4a" + varint(len(key_value)) + key_value[:-8])

    def _int_heads(self, key: str) -> list[bytes]:
        prefix = self._key(key)  # KeyValue: key, then value (2) = AnyValue int_value (3) of n varint bytes
        return self._cached(self._ints, key, [b"\x4a" + varint(len(prefix) + 3 + n) + prefix + b"\x12" +
                                              _ONE_BYTE[1 + n] + b"\x18" for n in range(11)])

    def attribute(self, key: str, value: Any) -> bytes:
        """Span.attributes (9): a KeyValue."""
        kind = type(value)
        if kind is float:
            return (self._doubles.get(key) or self._double_head(key)) + _pack_double(value)
        if kind is int:
            encoded = varint(value & _INT64)
            return (self._ints.get(key) or self._int_heads(key))[len(encoded)] + encoded
        if (kind is str and len(value) <= 64) or (
                kind is tuple and len(value) <= 4 and all(type(item) is str and len(item) <= 64 for item in value)):
            found = self._strings.get((key, value))
            return found if found is not None else self._cached(
                self._strings, (key, value), _delimited(b"\x4a", self._key_value(key, value)))
        return _delimited(b"\x4a", self._key_value(key, value))

    def _plan(self, keys: tuple[str, ...]) -> _Plan:
        return self._cached(self._plans, id(keys), _Plan(keys, self._stable))

    def _attributes(self, keys: tuple[str, ...], values: tuple[Any, ...], append: Callable[[bytes], None]) -> None:
        plan = self._plans.get(id(keys))
        if plan is None or plan.keys is not keys:
            plan = self._plan(keys)
        if plan.stable is not None:
            stable = plan.stable(values)
            try:
                block, hashable = plan.blocks.get(stable), True
            except TypeError:  # an unhashable value: encoded, not cached
                block, hashable = None, False
            if block is None:
                block = b"".join(self.attribute(key, value) for key, value in zip(plan.stable_keys, stable)
                                 if value is not None)
                if hashable:
                    self._cached(plan.blocks, stable, block)
            append(block)
        doubles, ints = self._doubles, self._ints
        for i, key in plan.varying:
            value = values[i]
            kind = type(value)
            if kind is float:
                append(doubles.get(key) or self._double_head(key))
                append(_pack_double(value))
            elif kind is int:
                encoded = varint(value & _INT64)
                append((ints.get(key) or self._int_heads(key))[len(encoded)])
                append(encoded)
            elif value is not None:
                append(self.attribute(key, value))

    def _event(self, name: str, at: int) -> bytes:
        """Span.events (11): an Event (time_unix_nano 1, name 2)."""
        around = self._events.get(name)
        if around is None:
            named = _delimited(b"\x12", utf8(name))
            around = self._cached(self._events, name, (b"\x5a" + varint(9 + len(named)) + b"\x09", named))
        return around[0] + _pack_fixed64(at) + around[1]

    def _span(self, span: SpanRecord, trace_head: bytes) -> bytes:
        """ScopeSpans.spans (2): a Span, after its trace id (field 1)."""
        _, span_id, parent_id, flags, trace_state, name, kind, start, end, keys, values, events, error = span
        parts = [trace_head, _pack_span_id(0x1208, span_id)]
        if trace_state:
            parts.append(_delimited(b"\x1a", utf8(trace_state)))
        if parent_id:
            parts.append(_pack_span_id(0x2208, parent_id))
        named = self._names.get(name)
        if named is None:
            named = self._cached(self._names, name, _delimited(b"\x2a", utf8(name)))
        parts += (named, _pack_times(0x30, kind, 0x39, start, 0x41, end))
        if keys:
            self._attributes(keys, values, parts.append)
        if events:
            parts += [self._event(event_name, at) for event_name, at in events]
        if error is not None:  # Status: message 2, code 3
            message = _delimited(b"\x12", utf8(error)) if error else b""
            parts.append(_delimited(b"\x7a", message + b"\x18" + _ONE_BYTE[STATUS_ERROR]))
        parts.append(_pack_flags(0x0185, flags))  # flags: field 16, fixed32 (the tag's varint: 0x85 0x01)
        return _delimited(b"\x12", b"".join(parts))

    def request(self, spans: Iterable[SpanRecord]) -> bytes:
        encoded, last_trace, trace_head = [], -1, b""
        for span in spans:  # a trace's spans are queued together: its id is encoded once
            try:
                if span[0] != last_trace:
                    last_trace, trace_head = span[0], b"\x0a\x10" + span[0].to_bytes(16, "big")
                encoded.append(self._span(span, trace_head))
            except Exception:  # this span only: the batch goes without it
                self.unencodable += 1
                last_trace = -1
                log.exception("trace_span_unencodable", name=span[5] if len(span) > 5 else None)
        scope_spans = self._scope + b"".join(encoded)
        resource_spans = self._resource + _delimited(b"\x12", scope_spans)
        return _delimited(b"\x0a", resource_spans)


# ---- the exporter thread ----

class Exporter:
    """The bounded span queue and the thread that empties it. `submit` is the request path's only call:
    it appends or drops, never waits. `post` replaces the HTTP POST (benchmarks, tests)."""

    def __init__(self, settings: ExportSettings, encoder: SpanEncoder, post: Callable[[bytes], None] | None = None,
                 user_agent: str = "llm-gateway") -> None:
        self.settings = settings
        self.encoder = encoder
        self.dropped = 0  # spans the full queue turned away (written by the request path only)
        self.exported = 0
        self.failed = 0  # spans whose export failed for good (refused, rejected, unencodable)
        self._queue: deque[SpanRecord] = deque()
        self._max_queue = settings.max_queue_size
        self._batch = settings.max_batch_size
        self._wake = threading.Event()
        self._stopping = False
        self._flushed: list[threading.Event] = []
        self._reported_drops = 0
        self._stopped = threading.Event()  # cuts retries' backoff short
        self._poster: HttpPoster | None = None
        if post is None:
            self._poster = HttpPoster(settings, user_agent, self._stopped)
            post = self._poster.post
        self._post = post
        self._thread = threading.Thread(target=self._run, name="otlp-trace-exporter", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)

    def submit(self, spans: Sequence[SpanRecord]) -> None:
        queue = self._queue
        if len(queue) + len(spans) > self._max_queue or self._stopping:
            self.dropped += len(spans)
            return
        queue.extend(spans)
        if len(queue) >= self._batch and not self._wake.is_set():
            self._wake.set()

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export everything queued now; False if that took longer than timeout_s."""
        done = threading.Event()
        self._flushed.append(done)
        self._wake.set()
        return done.wait(timeout_s)

    def shutdown(self) -> None:
        """Export what is queued and stop the thread (blocking, up to OTEL_BSP_EXPORT_TIMEOUT)."""
        if self._stopping:
            return
        atexit.unregister(self.shutdown)
        self._stopping = True
        self._stopped.set()
        self._wake.set()
        self._thread.join(self.settings.shutdown_timeout_s)

    def _run(self) -> None:
        while True:
            woken = self._wake.wait(self.settings.schedule_delay_s)
            self._wake.clear()  # before draining: a wake-up while draining is kept for the next turn
            stopping, flushed = self._stopping, self._flushed
            self._flushed = []
            self._drain(everything=not woken or stopping or bool(flushed))  # woken by a full batch: full ones
            for done in flushed:
                done.set()
            self._report_drops()
            if stopping:
                if self._poster is not None:
                    self._poster.close()
                return

    def _drain(self, everything: bool) -> None:
        queue, popleft, size = self._queue, self._queue.popleft, self._batch
        while len(queue) >= size or (everything and queue):
            batch = [popleft() for _ in range(min(size, len(queue)))]
            before = self.encoder.unencodable
            body = self.encoder.request(batch)
            left_out = self.encoder.unencodable - before
            sent = len(batch) - left_out
            self.failed += left_out
            try:
                self._post(body)
                self.exported += sent
            except PartiallyRejected as err:
                self.exported += sent - err.rejected
                self.failed += err.rejected
                log.warning("trace_spans_rejected", spans=sent, rejected=err.rejected,
                            endpoint=redact_url(self.settings.endpoint),
                            reason=str(err))
            except ExportFailed as err:
                self.failed += sent
                log.warning("trace_export_failed", spans=sent, endpoint=redact_url(self.settings.endpoint),
                            reason=str(err))
            except Exception:
                self.failed += sent
                log.exception("trace_export_failed", spans=sent, endpoint=redact_url(self.settings.endpoint))

    def _report_drops(self) -> None:
        dropped = self.dropped
        if dropped > self._reported_drops:
            log.warning("trace_spans_dropped", dropped=dropped - self._reported_drops, total=dropped,
                        max_queue_size=self._max_queue)
            self._reported_drops = dropped
