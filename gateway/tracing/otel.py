"""The OpenTelemetry side of tracing, imported only when tracing is on (see gateway.tracing).

One SERVER span per request, named "{gen_ai.operation.name} {gen_ai.request.model}", continuing the
caller's `traceparent`; a child span for each stage that takes time of its own: classification,
cache, admission (the queue wait) and upstream. The stage that answers keeps its span open until the
answer is sent, so the upstream span covers the whole stream, with its time to first token. The request
to the backend carries the upstream span's `traceparent`."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from gateway.config.routes import TracingSettings
from gateway.types import Reply, Stage

if TYPE_CHECKING:
    from gateway.context import RequestContext

Attributes = dict[str, AttributeValue]
OPERATIONS = {"chat": "chat", "completions": "text_completion"}
SPANS = {"ClassifyStage": "classification", "CacheStage": "cache", "AdmissionStage": "admission",
         "ProxyStage": "upstream"}  # the other stages take microseconds: no span of their own


def _ran(name: str, ctx: RequestContext) -> bool:
    """Whether a stage that let the request go on did something worth a span."""
    if name == "classification":
        return ctx.difficulty is not None
    if name == "cache":
        return ctx.cache != "off"
    return True


def _stage_attributes(name: str, ctx: RequestContext) -> Attributes:
    if name == "classification":
        return {} if ctx.difficulty is None else {"gateway.difficulty": ctx.difficulty}
    if name == "cache":
        return {"gateway.cache": ctx.cache}
    if name == "admission":
        return {"gateway.queue_ms": ctx.queue_ms}
    return _upstream(ctx)


class Tracing:
    """The tracer provider (its own, not the process-global one) and the OTLP/HTTP exporter."""

    def __init__(self, settings: TracingSettings) -> None:
        service = settings.service_name or os.environ.get("OTEL_SERVICE_NAME") or "llm-gateway"
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio)) if settings.sample_ratio is not None else None
        self.provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": service}))
        endpoint = f"{settings.endpoint.rstrip('/')}/v1/traces" if settings.endpoint else None
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("gateway")
        self.propagator = TraceContextTextMapPropagator()

    def start(self, headers: Mapping[str, str], ctx: RequestContext) -> RequestTrace:
        """The request's trace, continuing the caller's when its headers carry a valid `traceparent`."""
        parent = self.propagator.extract(headers) if "traceparent" in headers else None
        operation = OPERATIONS.get(ctx.endpoint, ctx.endpoint)
        root = self.tracer.start_span(operation, context=parent, kind=SpanKind.SERVER)
        return RequestTrace(self, root)

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: call it from a thread)."""
        self.provider.shutdown()


class RequestTrace:
    __slots__ = ("_tracing", "root", "recording", "_context", "_upstream", "_answer", "_sent_at", "_first_byte_at")

    def __init__(self, tracing: Tracing, root: Span) -> None:
        self._tracing = tracing
        self.root = root
        self.recording = root.is_recording()  # sampled: the stages get spans (else only traceparent goes on)
        self._context = set_span_in_context(root)
        self._upstream: Span | None = None  # open while the backend answers (its traceparent is the parent)
        self._answer: tuple[str, int] | None = None  # the stage that answered, and when it started
        self._sent_at = 0.0  # perf_counter() when the upstream stage began
        self._first_byte_at: float | None = None  # ... and when the backend's first byte came

    async def stage(self, stage: Stage, ctx: RequestContext) -> Reply | None:
        """Run one stage, traced when it gets a span. Spans of stages with nothing to show (no classifier
        score, no cache lookup) are left out; all but the upstream's are made when the stage ends."""
        name = SPANS.get(type(stage).__name__)
        if name is None:
            return await stage(ctx)
        started_ns = time.time_ns()
        if name == "upstream":
            self._upstream = self._tracing.tracer.start_span("gateway.upstream", self._context, start_time=started_ns)
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
        upstream = name == "upstream" and self._upstream is not None
        span = self._upstream if upstream else self._tracing.tracer.start_span(
            f"gateway.{name}", self._context, start_time=started_ns)
        assert span is not None
        span.set_attributes(_stage_attributes(name, ctx))
        if upstream and self._first_byte_at is not None:
            span.set_attribute("gateway.ttfb_ms", (self._first_byte_at - self._sent_at) * 1000)
            span.add_event("first_byte", timestamp=_wall_ns(self._first_byte_at))
        if upstream and ctx.first_token_at is not None:
            span.add_event("first_token", timestamp=_wall_ns(ctx.first_token_at))
        if error is not None:
            span.set_status(StatusCode.ERROR, error)
        span.end()

    def _first_byte(self, at: float) -> None:
        self._first_byte_at = at

    def headers(self) -> dict[str, str]:
        """`traceparent` (and `tracestate`) for the request to the backend: the upstream span (or, when
        the trace is not sampled, the request's, flagged so)."""
        carrier: dict[str, str] = {}
        span = self._upstream or self.root
        self._tracing.propagator.inject(carrier, context=set_span_in_context(span))
        return carrier

    def finish(self, ctx: RequestContext) -> None:
        """End the answering stage's span and the request's span with what the request came to
        (a finisher: runs after accounting, so tokens and cost are known)."""
        if not self.recording:
            return
        if self._answer is not None:
            self._end(*self._answer, ctx)
        operation = OPERATIONS.get(ctx.endpoint, ctx.endpoint)
        self.root.update_name(f"{operation} {ctx.model_requested}" if ctx.model_requested else operation)
        self.root.set_attributes(_request_attributes(ctx, operation))
        if ctx.status >= 500 or ctx.outcome == "internal_error":
            self.root.set_status(StatusCode.ERROR, ctx.error or ctx.outcome)
        self.root.end()


def _request_attributes(ctx: RequestContext, operation: str) -> Attributes:
    """GenAI semantic-convention attributes, and the gateway's own."""
    found: dict[str, AttributeValue | None] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": ctx.model_requested,
        "gen_ai.response.model": ctx.replica.model if ctx.replica else None,
        "gen_ai.request.max_tokens": ctx.max_tokens,
        "gen_ai.usage.input_tokens": ctx.prompt_tokens,
        "gen_ai.usage.output_tokens": ctx.completion_tokens,
        "gen_ai.response.finish_reasons": [ctx.finish_reason] if ctx.finish_reason else None,
        "http.response.status_code": ctx.status,
        "gateway.request_id": ctx.request_id,
        "gateway.tenant": ctx.tenant_name,
        "gateway.tier": ctx.tier.name if ctx.tier else None,
        "gateway.difficulty": ctx.difficulty,
        "gateway.queue_ms": ctx.queue_ms,
        "gateway.cache": ctx.cache,
        "gateway.cost_usd": ctx.cost_usd,
        "gateway.outcome": ctx.outcome,
        "gateway.error": ctx.error,
        "gateway.ttft_ms": (ctx.first_token_at - ctx.started) * 1000 if ctx.first_token_at is not None else None,
    }
    return {key: value for key, value in found.items() if value is not None}


def _wall_ns(perf: float) -> int:
    """A time.perf_counter() reading as wall-clock nanoseconds (what span events take)."""
    return time.time_ns() - int((time.perf_counter() - perf) * 1e9)


def _upstream(ctx: RequestContext) -> Attributes:
    if ctx.replica is None:
        return {"gateway.attempts": ctx.attempts}
    url = urlsplit(ctx.replica.url)
    return {"gateway.backend": ctx.replica.name, "gateway.attempts": ctx.attempts,
            "server.address": url.hostname or "", "server.port": url.port or 80}
