"""The trace exporter's settings, encodings and propagation against the OpenTelemetry specifications:
OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT in milliseconds, OTEL_EXPORTER_OTLP_PROTOCOL (grpc refused, http/json
spoken), strings UTF-8 cannot encode, OTLP/JSON equal to the protobuf encoding (both decoded with
opentelemetry-proto), OTEL_PROPAGATORS, an IPv6 endpoint, and spans named by the request path."""

from __future__ import annotations

import base64
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from typing import Any

import orjson
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from structlog.testing import capture_logs

from gateway.config.routes import TracingSettings
from gateway.tracing import UnsupportedProtocol, check_tracing
from gateway.tracing.otel import Tracing
from gateway.tracing.otlp import Encoder, Exporter, SpanRecord
from gateway.tracing.settings import ExportSettings
from gateway.tracing.otlp_http import HttpPoster
from gateway.tracing.otlp_json import JsonEncoder

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
CALLER = {"traceparent": f"00-{TRACE}-{PARENT}-01", "tracestate": "v=1"}


def span(name: str = "chat", keys: tuple[str, ...] = (), values: tuple[Any, ...] = (), span_id: int = 0x11,
         error: str | None = None, events: tuple[tuple[str, int], ...] | None = None) -> SpanRecord:
    return (int(TRACE, 16), span_id, int(PARENT, 16), 0x301, "v=1", name, 2, 1_000, 2_000, keys, values, events,
            error)


def decoded(body: bytes) -> list[Span]:
    export = ExportTraceServiceRequest.FromString(body)
    return [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]


def from_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON read as the specification defines it: the protobuf JSON mapping, ids in hex."""
    def ids_to_base64(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId")
                    else ids_to_base64(v) for k, v in value.items()}
        return [ids_to_base64(v) for v in value] if isinstance(value, list) else value

    return json_format.ParseDict(ids_to_base64(orjson.loads(body)), ExportTraceServiceRequest())


# ---- settings ----

def test_the_timeout_variables_are_milliseconds() -> None:
    assert ExportSettings.from_environ({}).timeout_s == 10.0
    assert ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}).timeout_s == 2.5
    assert ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
                                        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "750"}).timeout_s == 0.75
    with capture_logs() as logs:  # seconds written as the Python SDK reads them: said
        assert ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10"}).timeout_s == 0.01
    assert [(e["event"], e["milliseconds"]) for e in logs] == [("tracing_short_timeout", 10.0)]


def test_grpc_is_refused_with_the_reason_and_http_json_is_spoken() -> None:
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    for variable in ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        with pytest.raises(UnsupportedProtocol, match=f"{variable}=grpc: .*OTLP/HTTP only.*4318"):
            check_tracing(None, {**on, variable: "grpc"})
        with pytest.raises(UnsupportedProtocol):
            ExportSettings.from_environ({variable: "grpc"})
    check_tracing(None, {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})  # tracing off: nothing to refuse
    check_tracing(None, {**on, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SDK_DISABLED": "true"})
    both = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}
    assert ExportSettings.from_environ(both).protocol == "http/json"  # the signal's variable first
    assert ExportSettings.from_environ({}).protocol == "http/protobuf"
    with capture_logs() as logs:
        assert ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}).protocol == "http/protobuf"
    assert [(e["event"], e["value"]) for e in logs] == [("tracing_bad_setting", "thrift")]
    poster = HttpPoster(ExportSettings(protocol="http/json"), "ua", threading.Event())
    assert poster._headers["content-type"] == "application/json"


@pytest.mark.parametrize(("endpoint", "host", "port"), [
    ("http://[::1]/v1/traces", "::1", 80), ("https://[::1]/v1/traces", "::1", 443),
    ("http://[fe80::1]:4318/v1/traces", "fe80::1", 4318), ("http://collector/v1/traces", "collector", 80)])
def test_an_ipv6_endpoint_is_parsed_as_its_address(endpoint: str, host: str, port: int) -> None:
    poster = HttpPoster(ExportSettings(endpoint=endpoint), "ua", threading.Event())
    assert (poster.host, poster.port) == (host, port)
    connection = poster._connection(1.0)  # (not connected yet: http.client keeps what it was given)
    assert (connection.host, connection.port) == (host, port)


# ---- encoding ----

def test_a_string_utf8_cannot_encode_loses_only_itself_not_the_batch() -> None:
    lone = "bad\ud800 \udfff"
    spans = [span("before", span_id=1), span(lone, (lone, "ok"), (lone, ("x", lone)), span_id=2, error=lone,
                                             events=((lone, 1_500),)), span("after", span_id=3)]
    exports: list[bytes] = []
    exporter = Exporter(ExportSettings(schedule_delay_s=0.01), Encoder({"service.name": lone}, lone, {"ok"}),
                        post=exports.append)
    exporter.submit(spans)
    exporter.shutdown()
    assert exporter.exported == 3 and exporter.failed == 0
    found = decoded(b"".join(exports))
    assert [s.name for s in found] == ["before", "bad\ufffd \ufffd", "after"]
    middle = found[1]
    attributes = {a.key: a.value for a in middle.attributes}
    assert set(attributes) == {"bad\ufffd \ufffd", "ok"} and attributes["bad\ufffd \ufffd"].string_value == "bad\ufffd \ufffd"
    assert [v.string_value for v in attributes["ok"].array_value.values] == ["x", "bad\ufffd \ufffd"]
    assert middle.status.message == "bad\ufffd \ufffd" and middle.events[0].name == "bad\ufffd \ufffd"
    json = JsonEncoder({"service.name": lone}, lone)
    assert [s.name for s in from_json(json.request(spans)).resource_spans[0].scope_spans[0].spans][1] \
        == "bad\ufffd \ufffd"


def test_a_span_that_cannot_be_encoded_is_left_out_and_counted() -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    for encoder in (Encoder({}, "gateway"), JsonEncoder({}, "gateway")):
        exports: list[bytes] = []
        exporter = Exporter(ExportSettings(schedule_delay_s=0.01), encoder, post=exports.append)
        exporter.submit([span("a", span_id=1), span("b", ("k",), (Unprintable(),), span_id=2), span("c", span_id=3)])
        with capture_logs() as logs:
            exporter.shutdown()
        assert (exporter.exported, exporter.failed) == (2, 1)
        names = [s.name for s in (decoded(exports[0]) if isinstance(encoder, Encoder) else
                                  from_json(exports[0]).resource_spans[0].scope_spans[0].spans)]
        assert names == ["a", "c"] and "trace_span_unencodable" in {e["event"] for e in logs}


VALUES = ("text", "é" * 70, True, False, 0, -7, 2**40, 2**63 - 1, -(2**63), 3.25, -0.0, math.inf, -math.inf,
          ("stop", "length"), [1, 2.5, "x"], b"\x00\xff", None)


def test_otlp_json_is_the_protobuf_encoding_in_json() -> None:
    keys = tuple(f"k{i}" for i in range(len(VALUES)))
    spans = [span("chat auto", keys, VALUES, span_id=0x1111, error="RuntimeError: boom"),
             (int(TRACE, 16), 0x2222, 0x1111, 0x101, "", "gateway.upstream", 3, 1_500, 1_900, ("n",), (1,),
              (("first_byte", 1_600),), ""),
             (int("ab" * 16, 16), 0x3333, 0, 0x100, "", "root", 2, 5, 6, (), (), None, None)]
    resource = {"service.name": "svc", "n": 3}
    body = JsonEncoder(resource, "gateway").request(spans)
    assert from_json(body) == ExportTraceServiceRequest.FromString(Encoder(resource, "gateway").request(spans))
    document = orjson.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert document[0]["traceId"] == TRACE and document[0]["kind"] == 2  # hex ids, enums as integers
    assert document[0]["startTimeUnixNano"] == "1000"  # 64-bit integers as strings
    nan = JsonEncoder({}, "g").request([span("n", ("x",), (math.nan,))])
    assert math.isnan(from_json(nan).resource_spans[0].scope_spans[0].spans[0].attributes[0].value.double_value)


# ---- propagation ----

@contextmanager
def tracing(environ: dict[str, str]) -> Iterator[Tracing]:
    traced = Tracing(TracingSettings(endpoint="http://127.0.0.1:9"), post=lambda body: None, environ=environ)
    try:
        yield traced
    finally:
        traced.shutdown()


def carried(environ: dict[str, str], headers: dict[str, str]) -> tuple[bool, dict[str, str], list[str]]:
    """(the caller's trace continued, the headers for the backend, the warnings logged)."""
    from gateway.context import RequestContext
    from gateway.testing import gateway_config, tier

    ctx = RequestContext("r1", "chat", gateway_config([tier("t", ["http://127.0.0.1:9/v1"])]), b"", None, 0.0, 0.0)
    with capture_logs() as logs, tracing(environ) as traced:
        trace = traced.start(headers, ctx)
    return f"{trace.trace_id:032x}" == TRACE, trace.headers(), [e["event"] for e in logs if e["log_level"] == "warning"]


BAGGAGE = "user=alice , no-equals, tenant = acme;ttl=5 ,bad key=1"


def test_otel_propagators_decides_what_is_taken_and_given() -> None:
    caller = {**CALLER, "baggage": BAGGAGE}
    continued, headers, warnings = carried({}, caller)  # default: tracecontext,baggage
    assert continued and headers["traceparent"].startswith(f"00-{TRACE}-") and headers["tracestate"] == "v=1"
    assert headers["baggage"] == "user=alice,tenant = acme;ttl=5" and not warnings
    continued, headers, _ = carried({"OTEL_PROPAGATORS": "tracecontext"}, caller)
    assert continued and set(headers) == {"traceparent", "tracestate"}
    continued, headers, _ = carried({"OTEL_PROPAGATORS": "baggage"}, caller)
    assert not continued and headers == {"baggage": "user=alice,tenant = acme;ttl=5"}
    for none in ("none", "None", "tracecontext,none"):
        continued, headers, warnings = carried({"OTEL_PROPAGATORS": none}, caller)
        assert not continued and headers == {}
    assert warnings == ["tracing_propagators_none"]  # none beside others: said
    continued, headers, warnings = carried({"OTEL_PROPAGATORS": "b3, tracecontext,tracecontext,jaegerx"}, caller)
    assert continued and set(headers) == {"traceparent", "tracestate"}
    assert warnings == ["tracing_unsupported_propagator", "tracing_unknown_propagator"]  # b3; jaegerx


def test_baggage_over_the_w3c_limits_is_not_passed_on() -> None:
    _, headers, _ = carried({}, {"baggage": "k=" + "v" * 8192})
    assert "baggage" not in headers  # longer than 8192 bytes: none of it
    _, headers, _ = carried({}, {"baggage": ",".join(f"k{i}=v" for i in range(200))})
    assert headers["baggage"].count(",") == 179  # the first 180 members


# ---- spans named by the request path ----

async def test_a_renamed_stage_class_keeps_its_span() -> None:
    """Spans follow the stage's place in RequestPath, not its class's name: stage classes renamed (and
    subclassed) under names no tracer could know still get theirs, and the upstream one is a CLIENT span."""
    from gateway.context import RequestContext
    from gateway.pipeline import SPANS, RequestPath
    from gateway.testing import gateway_config, tier
    from gateway.types import JsonReply

    class Step:
        def __init__(self, field: str) -> None:
            self.field = field

        async def __call__(self, ctx: RequestContext) -> JsonReply | None:
            if self.field == "classify":
                ctx.route.difficulty = 0.25
            elif self.field == "cache":
                ctx.cache = "miss"
            return JsonReply(200, b"{}") if self.field == "proxy" else None

    async def passed_on(ctx: RequestContext, reply: JsonReply) -> JsonReply:  # escalate: takes the reply
        return reply

    names = [f.name for f in fields(RequestPath)][:-2]
    assert [f.name for f in fields(RequestPath)][-2:] == ["escalate", "account"]
    path = RequestPath(**{name: type(f"Renamed{i}", (Step,), {})(name) for i, name in enumerate(names)},  # type: ignore[arg-type]
                       escalate=passed_on, account=None)  # type: ignore[arg-type]
    assert dict(zip(names, SPANS)) == {"parse": None, "policy": None, "classify": "classification", "route": None,
                                       "session": None, "detour": None, "spill": None, "shadow": None, "cache": "cache",
                                       "affinity": None, "rank": None, "admission": "admission", "embed": None,
                                       "proxy": "upstream"}
    exports: list[bytes] = []
    traced = Tracing(TracingSettings(endpoint="http://127.0.0.1:9"), post=exports.append, environ={})
    try:
        ctx = RequestContext("r1", "chat", gateway_config([tier("t", ["http://127.0.0.1:9/v1"])]), b"", None, 0.0, 0.0)
        ctx.trace = trace = traced.start({}, ctx)
        assert (await path.run(ctx)).status == 200  # type: ignore[union-attr]
        trace.finish(ctx)
        assert traced.force_flush(5)
    finally:
        traced.shutdown()
    kinds = {s.name: s.kind for s in decoded(b"".join(exports))}
    assert kinds == {"chat": Span.SPAN_KIND_SERVER, "gateway.classification": Span.SPAN_KIND_INTERNAL,
                     "gateway.cache": Span.SPAN_KIND_INTERNAL, "gateway.admission": Span.SPAN_KIND_INTERNAL,
                     "gateway.upstream": Span.SPAN_KIND_CLIENT}
