"""The OpenTelemetry side of tracing, imported only when tracing is on (see gateway.tracing).

One SERVER span per request, named "{gen_ai.operation.name} {gen_ai.request.model}", continuing the
caller's `traceparent`; a child span for each stage the request path marks as traced (gateway.pipeline:
classification, cache, admission (the queue wait) and upstream, a CLIENT span: the call to the backend).
The stage that answers keeps its span open until the answer is sent, so the upstream span covers the
whole stream, with its time to first token. The request to the backend carries the upstream span's
`traceparent`, and the caller's `baggage`.

No OpenTelemetry SDK: its per-span objects made full sampling cost +65 % CPU per request. A request's
spans are plain tuples (ids from random.getrandbits, times from time.time_ns) handed, when the request
finishes, to the exporter thread of gateway.tracing.otlp, which batches and encodes them as OTLP
protobuf (or JSON); the request path never waits on it. Sampling and propagation are the SDK's
(OTEL_TRACES_SAMPLER and its argument; OTEL_PROPAGATORS: W3C trace context and baggage, the default,
either, or none), from the same variables."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Awaitable, Mapping
from functools import lru_cache
from random import getrandbits
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import structlog

import gateway
from gateway.backends.urls import redact_url
from gateway.config.routes import TracingSettings
from gateway.tracing import ADMISSION, CACHE, CLASSIFICATION, UPSTREAM
from gateway.tracing.otlp import FLAG_HAS_IS_REMOTE, FLAG_IS_REMOTE, FLAG_SAMPLED, KIND_CLIENT, KIND_INTERNAL, \
    KIND_SERVER, Encoder, Exporter, SpanEncoder, SpanRecord
from gateway.tracing.otlp_json import JsonEncoder
from gateway.tracing.settings import ExportSettings, parse_key_values
from gateway.types import Reply

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.context import RequestContext

    StageCall = Callable[[RequestContext], Awaitable[Reply | None]]  # a pipeline Stage

log = structlog.get_logger("gateway.tracing")

OPERATIONS = {"chat": "chat", "completions": "text_completion"}
# span names by stage span (a stage span this module has no attributes for is named the same way)
SPAN_NAMES = {name: f"gateway.{name}" for name in (CLASSIFICATION, CACHE, ADMISSION, UPSTREAM)}
SCOPE = "gateway"  # the instrumentation scope's name
ROOT_KEYS = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.request.max_tokens",
             "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons",
             "http.response.status_code", "gateway.request_id", "gateway.tenant", "gateway.tier",
             "gateway.difficulty", "gateway.queue_ms", "gateway.cache", "gateway.cost_usd", "gateway.outcome",
             "gateway.error", "gateway.ttft_ms", "gateway.experiment", "gateway.arm")
# attributes with few distinct values: the encoder caches their encodings together (the others: one by one)
STABLE_KEYS = ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model",
               "gen_ai.response.finish_reasons", "http.response.status_code", "gateway.tenant", "gateway.tier",
               "gateway.cache", "gateway.outcome", "gateway.experiment", "gateway.arm", "gateway.backend",
               "gateway.attempts", "server.address", "server.port")
_DIFFICULTY, _CACHE, _QUEUE = ("gateway.difficulty",), ("gateway.cache",), ("gateway.queue_ms",)
_ATTEMPTS = ("gateway.attempts",)
_BACKEND = ("gateway.backend", "gateway.attempts", "server.address", "server.port")
_WITH_TTFB = {_ATTEMPTS: (*_ATTEMPTS, "gateway.ttfb_ms"), _BACKEND: (*_BACKEND, "gateway.ttfb_ms")}  # (constants:
# the encoder keeps a plan per tuple of keys)
_NONE: tuple[Any, ...] = ()
_NO_ARM = (None, None)  # gateway.experiment, gateway.arm outside an experiment
_ID64, _TRACE_ID_LIMIT = (1 << 64) - 1, 1 << 64
_CHILD_FLAGS = FLAG_HAS_IS_REMOTE | FLAG_SAMPLED

# W3C trace context, validated as the SDK's TraceContextTextMapPropagator does
_TRACEPARENT = re.compile(r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:(-.*)|[ \t]*)$")
_KEY = r"[a-z][_0-9a-z\-\*\/]{0,255}|[a-z0-9][_0-9a-z\-\*\/]{0,240}@[a-z][_0-9a-z\-\*\/]{0,13}"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(f"({_KEY})=({_VALUE})")
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")
PROPAGATORS = ("tracecontext", "baggage")  # what this tracer propagates; the specification's other names:
OTHER_PROPAGATORS = ("b3", "b3multi", "jaeger", "xray", "ottrace")  # warned about, ignored
# W3C baggage: a member is key=value (a token, then baggage-octets), with ;properties; the SDK's limits
_BAGGAGE_MEMBER = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+[ \t]*=[ \t]*[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"
                             r"(?:[ \t]*;[\x20-\x2b\x2d-\x7e]*)?")
BAGGAGE_MAX_BYTES, BAGGAGE_MAX_MEMBERS, BAGGAGE_MAX_MEMBER_BYTES = 8192, 180, 4096


class Sampler:
    """The SDK's samplers: a root decision from the trace id (always_on, always_off, traceidratio: the
    trace id's low 64 bits under ratio * 2**64), and for the parentbased_* ones a caller's `traceparent`
    decides instead (its sampled flag)."""

    __slots__ = ("parent_based", "bound", "description")

    def __init__(self, parent_based: bool, ratio: float) -> None:
        self.parent_based = parent_based
        self.bound = round(ratio * _TRACE_ID_LIMIT)
        self.description = f"{'parentbased_' if parent_based else ''}traceidratio {ratio}"

    def sampled(self, trace_id: int, parent_sampled: bool | None) -> bool:
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        return trace_id & _ID64 < self.bound

    @classmethod
    def configured(cls, ratio: float | None, environ: Mapping[str, str] = os.environ) -> Sampler:
        """The routes file's ratio (parent-based), else OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
        (default parentbased_always_on; an unknown name or a bad ratio falls back as in the SDK)."""
        if ratio is not None:
            return cls(True, ratio)
        name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").lower()
        if name not in SAMPLERS:
            log.warning("tracing_unknown_sampler", sampler=name, using="parentbased_always_on")
            name = "parentbased_always_on"
        parent_based = name.startswith("parentbased_")
        if name.endswith("always_on"):
            return cls(parent_based, 1.0)
        if name.endswith("always_off"):
            return cls(parent_based, 0.0)
        try:
            rate = float(environ.get("OTEL_TRACES_SAMPLER_ARG", ""))
            if not 0.0 <= rate <= 1.0:
                raise ValueError(rate)
        except ValueError:
            log.warning("tracing_bad_sampler_arg", value=environ.get("OTEL_TRACES_SAMPLER_ARG"), using=1.0)
            rate = 1.0
        return cls(parent_based, rate)


def parse_traceparent(headers: Mapping[str, str]) -> tuple[int, int, bool, str] | None:
    """(trace id, parent span id, sampled, tracestate) of a valid `traceparent` (and `tracestate`)."""
    header = headers.get("traceparent")
    if not header or len(header) > 512:
        return None
    match = _TRACEPARENT.search(header)
    if not match:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16 or version == "ff" or (version == "00" and rest):
        return None
    return int(trace_id, 16), int(span_id, 16), bool(int(flags, 16) & 1), _tracestate(headers.get("tracestate"))


def propagators(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """OTEL_PROPAGATORS (default tracecontext,baggage): the formats taken from the caller's headers and
    given to the backend's. `none` (alone or not) is none; a name this tracer does not propagate (b3,
    jaeger, ...) or does not know is warned about and left out."""
    names = [name.strip().lower() for name in environ.get("OTEL_PROPAGATORS", "").split(",") if name.strip()]
    if not names:
        return frozenset(PROPAGATORS)
    if "none" in names:
        if len(names) > 1:
            log.warning("tracing_propagators_none", value=environ["OTEL_PROPAGATORS"], using="none")
        return frozenset()
    for name in dict.fromkeys(names):  # (deduplicated, in order)
        if name not in PROPAGATORS:
            log.warning("tracing_unsupported_propagator" if name in OTHER_PROPAGATORS else "tracing_unknown_propagator",
                        propagator=name, supported=",".join(PROPAGATORS))
    return frozenset(names).intersection(PROPAGATORS)


def parse_baggage(values: list[str]) -> str:
    """The caller's `baggage` header(s), for the backend: its well-formed members, whitespace around them
    dropped; nothing when longer than 8192 bytes (the W3C limit a system must propagate), members past
    the 180th or longer than 4096 bytes left out, as the SDK does."""
    header = ",".join(values)
    if not header or len(header) > BAGGAGE_MAX_BYTES:
        return ""
    members = []
    for member in header.split(","):
        member = member.strip(" \t")
        if member and len(member) <= BAGGAGE_MAX_MEMBER_BYTES and _BAGGAGE_MEMBER.fullmatch(member):
            members.append(member)
            if len(members) == BAGGAGE_MAX_MEMBERS:
                break
    return ",".join(members)


def _tracestate(header: str | None) -> str:
    """The caller's `tracestate`, normalised; an invalid one (any bad member, a duplicate key, more than
    32 members or 8192 characters) is dropped whole, as the SDK does."""
    if not header or len(header) > 8192:
        return ""
    pairs: dict[str, str] = {}
    for member in header.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        match = _MEMBER.fullmatch(member)
        if not match or match.group(1) in pairs:
            return ""
        pairs[match.group(1)] = match.group(2)
    if len(pairs) > 32:
        return ""
    return ",".join(f"{key}={value}" for key, value in pairs.items())


def _new_id(bits: int) -> int:
    while True:
        found = getrandbits(bits)
        if found:
            return found


def resource_attributes(service_name: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """service.name (the routes file's, else OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES', else
    llm-gateway), OTEL_RESOURCE_ATTRIBUTES, and telemetry.sdk.* naming this exporter (not OpenTelemetry's
    SDK: the name `opentelemetry` is reserved for it)."""
    found: dict[str, Any] = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "gateway.tracing",
                             "telemetry.sdk.version": gateway.__version__}
    found.update(parse_key_values(environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    found["service.name"] = (service_name or environ.get("OTEL_SERVICE_NAME") or found.get("service.name")
                             or "llm-gateway")
    return found


class Tracing:
    """The sampler, the resource and the exporter (thread and queue), for the gateway's lifetime."""

    def __init__(self, settings: TracingSettings, post: Callable[[bytes], None] | None = None,
                 environ: Mapping[str, str] = os.environ) -> None:
        """`post` replaces the HTTP POST of each encoded export (benchmarks, tests)."""
        self.sampler = Sampler.configured(settings.sample_ratio, environ)
        self.resource = resource_attributes(settings.service_name, environ)
        self.export_settings = ExportSettings.from_environ(environ, settings.endpoint)
        propagating = propagators(environ)
        self.tracecontext, self.baggage = "tracecontext" in propagating, "baggage" in propagating
        encoder: SpanEncoder = JsonEncoder(self.resource, SCOPE) if self.export_settings.protocol == "http/json" \
            else Encoder(self.resource, SCOPE, STABLE_KEYS)
        self.exporter = Exporter(self.export_settings, encoder, post,
                                 user_agent=f"llm-gateway/{gateway.__version__} OTLP/HTTP")
        log.info("tracing_on", endpoint=redact_url(self.export_settings.endpoint),
                 protocol=self.export_settings.protocol,
                 sampler=self.sampler.description, propagators=",".join(sorted(propagating)) or "none",
                 service=self.resource["service.name"])

    def start(self, headers: Mapping[str, str], ctx: RequestContext) -> RequestTrace:
        """The request's trace, continuing the caller's when its headers carry a valid `traceparent` (and
        tracecontext is propagated); the caller's `baggage` kept for the backend (when baggage is)."""
        baggage = parse_baggage(_all(headers, "baggage")) if self.baggage and "baggage" in headers else ""
        parent = parse_traceparent(headers) if self.tracecontext and "traceparent" in headers else None
        if parent is None:
            trace_id = getrandbits(128) or _new_id(128)
            return RequestTrace(self, trace_id, 0, "", self.sampler.sampled(trace_id, None), FLAG_HAS_IS_REMOTE,
                                baggage)
        trace_id, parent_id, parent_sampled, trace_state = parent
        return RequestTrace(self, trace_id, parent_id, trace_state, self.sampler.sampled(trace_id, parent_sampled),
                            FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE, baggage)

    @property
    def dropped_spans(self) -> int:
        """Spans turned away because the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE)."""
        return self.exporter.dropped

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        return self.exporter.force_flush(timeout_s)

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: call it from a thread)."""
        self.exporter.shutdown()


class RequestTrace:
    __slots__ = ("_tracing", "trace_id", "span_id", "parent_id", "trace_state", "baggage", "recording", "_flags",
                 "_start_ns", "_spans", "_upstream", "_answer", "_sent_at", "_first_byte_at", "_finished")

    def __init__(self, tracing: Tracing, trace_id: int, parent_id: int, trace_state: str, sampled: bool,
                 flags: int, baggage: str = "") -> None:
        self._tracing = tracing
        self.baggage = baggage  # the caller's, for the backend
        self.trace_id = trace_id
        self.span_id = getrandbits(64) or _new_id(64)  # the request's span (upstream's parent when not sampled)
        self.parent_id = parent_id  # the caller's span, 0 when none
        self.trace_state = trace_state
        self.recording = sampled  # sampled: the stages get spans (else only traceparent goes on)
        self._flags = flags | FLAG_SAMPLED
        self._start_ns = time.time_ns() if sampled else 0
        self._spans: list[SpanRecord] = []  # the stages' spans, ended
        self._upstream = 0  # the upstream span's id while the backend answers (its traceparent is the parent)
        self._answer: tuple[str, int] | None = None  # the stage that answered, and when it started
        self._sent_at = 0.0  # perf_counter() when the upstream stage began
        self._first_byte_at: float | None = None  # ... and when the backend's first byte came
        self._finished = False

    def stage(self, span: str | None, stage: StageCall, ctx: RequestContext) -> Awaitable[Reply | None]:
        """Run one stage (await it), traced when the request path gives it a span (`span`: its name, None:
        none). Spans of stages with nothing to show (no classifier score, no cache lookup) are left out; a
        span is recorded when its stage ends (or, for the stage that answers, when the answer has been
        sent). A stage without a span of its own is returned as is: no wrapper on its way."""
        return stage(ctx) if span is None else self._traced(span, stage, ctx)

    async def _traced(self, name: str, stage: StageCall, ctx: RequestContext) -> Reply | None:
        started_ns = time.time_ns()
        if name == UPSTREAM:
            self._upstream = getrandbits(64) or _new_id(64)
            self._sent_at = time.perf_counter()
            ctx.first_byte_hooks.append(self._first_byte)
        try:
            reply = await stage(ctx)
        except BaseException as err:
            self._end(name, started_ns, ctx, f"{type(err).__name__}: {err}")
            raise
        if reply is not None:  # this stage answers: its span lasts until the answer is sent
            self._answer = (name, started_ns)
        elif _ran(name, ctx):
            self._end(name, started_ns, ctx)
        return reply

    def _end(self, name: str, started_ns: int, ctx: RequestContext, error: str | None = None) -> None:
        events: tuple[tuple[str, int], ...] | None = None
        kind = KIND_INTERNAL
        if name == UPSTREAM and self._upstream:
            span_id, kind = self._upstream, KIND_CLIENT
            keys, values = _upstream(ctx)
            if self._first_byte_at is not None:
                keys, values = _WITH_TTFB[keys], (*values, (self._first_byte_at - self._sent_at) * 1000)
                events = (("first_byte", _wall_ns(self._first_byte_at)),)
            if ctx.upstream.first_token_at is not None:
                events = (*(events or ()), ("first_token", _wall_ns(ctx.upstream.first_token_at)))
        else:
            span_id = getrandbits(64) or _new_id(64)
            keys, values = _stage_attributes(name, ctx)
        span_name = SPAN_NAMES.get(name) or f"gateway.{name}"
        self._spans.append((self.trace_id, span_id, self.span_id, _CHILD_FLAGS, self.trace_state, span_name, kind,
                            started_ns, time.time_ns(), keys, values, events, error))

    def _first_byte(self, at: float) -> None:
        self._first_byte_at = at

    def headers(self) -> dict[str, str]:
        """What the propagators give the request to the backend: `traceparent` (and `tracestate`) of the
        upstream span (or, when the trace is not sampled, the request's, flagged so); the caller's `baggage`."""
        carrier = {}
        if self._tracing.tracecontext:
            span_id = self._upstream or self.span_id
            carrier["traceparent"] = f"00-{self.trace_id:032x}-{span_id:016x}-{'01' if self.recording else '00'}"
            if self.trace_state:
                carrier["tracestate"] = self.trace_state
        if self.baggage:
            carrier["baggage"] = self.baggage
        return carrier

    def finish(self, ctx: RequestContext) -> None:
        """End the answering stage's span and the request's span with what the request came to
        (a finisher: runs after accounting, so tokens and cost are known), and queue them for export."""
        if not self.recording or self._finished:
            return
        self._finished = True
        if self._answer is not None:
            self._end(*self._answer, ctx)
        operation = OPERATIONS.get(ctx.endpoint, ctx.endpoint)
        name = f"{operation} {ctx.model_requested}" if ctx.model_requested else operation
        error = (ctx.result.error or ctx.result.outcome) if ctx.result.status >= 500 or ctx.result.outcome == "internal_error" else None
        spans = self._spans
        spans.append((self.trace_id, self.span_id, self.parent_id, self._flags, self.trace_state, name, KIND_SERVER,
                      self._start_ns, time.time_ns(), ROOT_KEYS, _request_attributes(ctx, operation), None, error))
        self._tracing.exporter.submit(spans)


def _ran(name: str, ctx: RequestContext) -> bool:
    """Whether a stage that let the request go on did something worth a span."""
    if name == CLASSIFICATION:
        return ctx.route.difficulty is not None
    if name == CACHE:
        return ctx.cache != "off"
    return True


def _stage_attributes(name: str, ctx: RequestContext) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    if name == CLASSIFICATION:
        return (_NONE, _NONE) if ctx.route.difficulty is None else (_DIFFICULTY, (ctx.route.difficulty,))
    if name == CACHE:
        return _CACHE, (ctx.cache,)
    if name == ADMISSION:
        return _QUEUE, (ctx.queue_ms,)
    if name == UPSTREAM:
        return _upstream(ctx)
    return _NONE, _NONE  # a stage the tracer knows nothing of: its span has its times and status only


def _all(headers: Mapping[str, str], name: str) -> list[str]:
    """Every value of a header (aiohttp's headers are a multidict; a plain mapping has one)."""
    getall = getattr(headers, "getall", None)
    return list(getall(name, ())) if getall is not None else [headers[name]]


def _upstream(ctx: RequestContext) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    if ctx.upstream.replica is None:
        return _ATTEMPTS, (ctx.upstream.attempts,)
    host, port = _address(ctx.upstream.replica.url)
    return _BACKEND, (ctx.upstream.replica.name, ctx.upstream.attempts, host, port)


@lru_cache(maxsize=1024)
def _address(url: str) -> tuple[str, int]:
    """server.address and server.port of a replica's URL."""
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _request_attributes(ctx: RequestContext, operation: str) -> tuple[Any, ...]:
    """GenAI semantic-convention attributes, and the gateway's own: the values of ROOT_KEYS (None: absent)."""
    return (operation, ctx.model_requested, ctx.upstream.replica.model if ctx.upstream.replica else None, ctx.max_tokens,
            ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, (ctx.upstream.finish_reason,) if ctx.upstream.finish_reason else None,
            ctx.result.status, ctx.request_id, ctx.tenant_name, ctx.route.tier.name if ctx.route.tier else None, ctx.route.difficulty,
            ctx.queue_ms, ctx.cache, ctx.result.cost_usd, ctx.result.outcome, ctx.result.error,
            (ctx.upstream.first_token_at - ctx.started) * 1000 if ctx.upstream.first_token_at is not None else None,
            *((ctx.assignment.experiment, ctx.assignment.arm) if ctx.assignment is not None else _NO_ARM))


def _wall_ns(perf: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (what span events take)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)
