"""OpenTelemetry traces end to end: a gateway exporting over OTLP/HTTP to a receiver inside the test
(decoded with opentelemetry-proto), an emulator backend that records the `traceparent` it gets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, \
    ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gateway.app import create_app
from gateway.config import GatewayConfig, RoutesConfig
from gateway.emulator.profiles import get_profile
from gateway.emulator.server import create_emulator_app
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config, tier
from tests.conftest import StartApp

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
BANDS = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}
STAGES = {"gateway.classification", "gateway.cache", "gateway.admission", "gateway.upstream"}


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.services: set[str] = set()

    async def traces(self, request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            self.services.update(a.value.string_value for a in resource_spans.resource.attributes
                                 if a.key == "service.name")
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self.traces)
        return app

    async def wait_for(self, roots: int, timeout_s: float = 10.0) -> None:
        for _ in range(int(timeout_s / 0.05)):
            if sum(1 for span in self.spans if not _is_child(span) or span.kind == Span.SPAN_KIND_SERVER) >= roots:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{roots} request spans expected, got {len(self.spans)} spans")


def parsed(traceparent: str) -> tuple[str, str, bool]:
    """(trace id, parent span id, sampled) of a W3C traceparent header."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, bool(int(flags, 16) & 1)


def _is_child(span: Span) -> bool:
    return bool(span.parent_span_id)


def attributes(span: Span) -> dict[str, Any]:
    return {a.key: value(a.value) for a in span.attributes}


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(item) for item in v.array_value.values]
    return getattr(v, kind) if kind else None


async def started(start_app: StartApp, routes: dict[str, Any] | None = None, redis_url: str | None = None
                  ) -> tuple[str, Receiver, list[dict[str, str]]]:
    """A receiver, an emulator that records the traceparent headers it gets, and a traced gateway."""
    receiver = Receiver()
    collector = await start_app(receiver.app())
    seen: list[dict[str, str]] = []  # the trace headers each request to the backend carried

    @web.middleware
    async def record(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        seen.append({k.lower(): v for k, v in request.headers.items()
                     if k.lower() in ("traceparent", "tracestate", "baggage")})
        return await handler(request)

    emulator = create_emulator_app(get_profile("int4"), 0, None)
    emulator.middlewares.append(record)
    backend = await start_app(emulator)
    config = gateway_config([tier("small", [f"{backend}/v1"]), tier("large", [f"{backend}/v1"])],
                            policy={"routing": BANDS})
    if routes is not None:
        tracing = {"endpoint": collector, **routes}
        routes_config = RoutesConfig.model_validate({**config.routes.model_dump(), "tracing": tracing})
        config = GatewayConfig.build(routes_config, config.policy)
    else:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = collector
    url = await start_app(create_app(config, TableScorer({"hard one": 0.9}, default=0.2), redis_url=redis_url))
    return url, receiver, seen


async def ask(url: str, prompt: str, stream: bool, headers: dict[str, str] | None = None) -> int:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 5, "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}", **(headers or {})}) as response:
            await response.read()
            return response.status


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)


async def test_one_trace_per_request_with_stage_spans_and_genai_attributes(start_app: StartApp, otel_env: None,
                                                                           redis_url: str) -> None:
    url, receiver, seen = await started(start_app, redis_url=redis_url)
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert await ask(url, "hard one", True, {"traceparent": caller}) == 200
    assert await ask(url, "easy one", False) == 200
    await receiver.wait_for(roots=2)
    await asyncio.sleep(0.2)  # children are exported with their root, or just before
    roots = [s for s in receiver.spans if s.kind == Span.SPAN_KIND_SERVER]
    assert len(roots) == 2 and len({s.trace_id for s in roots}) == 2 and receiver.services == {"gateway-under-test"}
    continued = next(s for s in roots if s.trace_id.hex() == CALLER_TRACE)
    assert continued.parent_span_id.hex() == CALLER_SPAN and continued.name == "chat auto"
    for root in roots:
        children = {s.name: s for s in receiver.spans if s.trace_id == root.trace_id and s is not root}
        assert set(children) == STAGES and all(c.parent_span_id == root.span_id for c in children.values())
        upstream = children["gateway.upstream"]
        assert upstream.kind == Span.SPAN_KIND_CLIENT  # the call to the replica: service graphs draw the edge
        assert {c.kind for name, c in children.items() if name != "gateway.upstream"} == {Span.SPAN_KIND_INTERNAL}
        assert upstream.end_time_unix_nano <= root.end_time_unix_nano
        assert attributes(upstream)["gateway.ttfb_ms"] > 0 and "first_byte" in {e.name for e in upstream.events}
        assert attributes(children["gateway.admission"])["gateway.queue_ms"] == 0.0
        assert 0 <= attributes(children["gateway.classification"])["gateway.difficulty"] <= 1
        found = attributes(root)
        assert found["gen_ai.operation.name"] == "chat" and found["gen_ai.request.model"] == "auto"
        assert found["gen_ai.response.model"] == "emulated"  # the replica's model name in the routes
        assert found["gen_ai.usage.input_tokens"] > 0 and found["gen_ai.usage.output_tokens"] > 0
        assert found["gen_ai.request.max_tokens"] == 5 and found["http.response.status_code"] == 200
        assert attributes(children["gateway.cache"])["gateway.cache"] == "bypass"  # not deterministic
        assert found["gateway.cache"] == "bypass" and found["gateway.cost_usd"] > 0 and found["gateway.queue_ms"] == 0
        assert found["gateway.tier"] == ("large" if root is continued else "small")
        assert found["gateway.difficulty"] == pytest.approx(0.9 if root is continued else 0.2)
        # the backend got the upstream span as its parent
        assert (root.trace_id.hex(), upstream.span_id.hex(), True) in [parsed(headers["traceparent"]) for headers in seen]


async def test_the_routes_file_turns_tracing_on_and_its_ratio_samples(start_app: StartApp, otel_env: None) -> None:
    url, receiver, seen = await started(start_app, {"sample_ratio": 0.0})
    assert await ask(url, "easy one", True) == 200
    caller = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"  # a sampled caller is continued whatever the ratio
    assert await ask(url, "easy one", True, {"traceparent": caller}) == 200
    await receiver.wait_for(roots=1)
    await asyncio.sleep(0.3)
    assert {s.trace_id.hex() for s in receiver.spans} == {CALLER_TRACE}
    names = {s.name for s in receiver.spans}  # without Redis no cache lookup, so no cache span
    assert names == {"chat auto", "gateway.classification", "gateway.admission", "gateway.upstream"}
    unsampled, continued = (parsed(headers["traceparent"]) for headers in seen)
    assert unsampled[0] != CALLER_TRACE and not unsampled[2]  # still propagated, flagged not sampled
    assert continued[0] == CALLER_TRACE and continued[2]


@pytest.mark.parametrize(("propagators", "given"), [
    (None, {"traceparent", "tracestate", "baggage"}), ("tracecontext", {"traceparent", "tracestate"}),
    ("baggage", {"baggage"}), ("none", set())])
async def test_otel_propagators_decide_what_the_backend_gets(start_app: StartApp, otel_env: None,
                                                             monkeypatch: pytest.MonkeyPatch, propagators: str | None,
                                                             given: set[str]) -> None:
    if propagators is not None:
        monkeypatch.setenv("OTEL_PROPAGATORS", propagators)
    url, receiver, seen = await started(start_app)
    caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "v=1", "baggage": "user=alice"}
    assert await ask(url, "easy one", True, caller) == 200
    await receiver.wait_for(roots=1)
    (backend,) = seen
    assert set(backend) == given
    if "baggage" in given:
        assert backend["baggage"] == "user=alice"
    continued = {s.trace_id.hex() for s in receiver.spans} == {CALLER_TRACE}
    assert continued == ("traceparent" in given)  # the caller's trace continued only with tracecontext


def test_tracing_off_imports_no_opentelemetry() -> None:
    code = ("import sys\nfrom gateway.app import create_app\nfrom gateway.testing import gateway_config, tier\n"
            "import gateway.http, gateway.tracing\n"
            "create_app(gateway_config([tier('t', ['http://127.0.0.1:9/v1'])]))\n"
            "assert not gateway.tracing.tracing_enabled(None)\n"
            "loaded = [m for m in sys.modules if m.startswith(('gateway.tracing.otel', 'opentelemetry.sdk.trace', "
            "'opentelemetry.exporter'))]\n"
            "assert not loaded, loaded\n")  # (redis-py imports opentelemetry's API when it is installed)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ---- the exporter's parts, without a gateway: encoding, sampling, propagation, queue, HTTP ----

TRACE_ID, ROOT_ID, CHILD_ID = int(CALLER_TRACE, 16), 0x1111, 0x2222


def _decoded(body: bytes) -> tuple[dict[str, Any], str, list[Span]]:
    """(resource attributes, scope name, spans) of one encoded export."""
    export = ExportTraceServiceRequest.FromString(body)
    assert len(export.resource_spans) == 1 and len(export.resource_spans[0].scope_spans) == 1
    resource_spans = export.resource_spans[0]
    resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
    scope = resource_spans.scope_spans[0]
    return resource, scope.scope.name, list(scope.spans)


def test_spans_encode_as_otlp_protobuf() -> None:
    from gateway.tracing.otlp import FLAG_HAS_IS_REMOTE, FLAG_IS_REMOTE, FLAG_SAMPLED, Encoder

    stable = {"k0", "k1", "k3", "k8", "k9", "k12", "server.port"}  # cached as blocks (k9: a list, unhashable)
    encoder = Encoder({"service.name": "svc", "deployment.environment": "test"}, "gateway", stable)
    values = ("chat", True, False, 0, -7, 2**40, 3.25, 0.0, ("stop", "length"), [1, 2.5], b"\x00\x01", "é" * 70,
              None, "short")
    keys = tuple(f"k{i}" for i in range(len(values)))
    root = (TRACE_ID, ROOT_ID, 0x00F067AA0BA902B7, FLAG_HAS_IS_REMOTE | FLAG_IS_REMOTE | FLAG_SAMPLED, "a=1,b=2",
            "chat auto", 2, 1_000, 5_000, keys, values, None, "RuntimeError: boom")
    child = (TRACE_ID, CHILD_ID, ROOT_ID, FLAG_HAS_IS_REMOTE | FLAG_SAMPLED, "", "gateway.upstream", 1, 2_000, 4_000,
             ("gateway.ttfb_ms", "server.port"), (12.5, 8000), (("first_byte", 2_500), ("first_token", 3_000)), None)
    first = encoder.request([root, child])
    assert encoder.request([root, child]) == first  # the caches give the same bytes
    def unordered(spans: list[Span]) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        found = []
        for span in spans:
            pairs = sorted((a.key, a.value.SerializeToString()) for a in span.attributes)
            del span.attributes[:]
            found.append((span.SerializeToString(), pairs))
        return found

    plain = Encoder({}, "gateway").request([root, child])  # no blocks: the same spans, attributes in key order
    assert unordered(_decoded(plain)[2]) == unordered(_decoded(first)[2])
    resource, scope, (span, upstream) = _decoded(first)
    assert resource == {"service.name": "svc", "deployment.environment": "test"} and scope == "gateway"
    assert span.trace_id.hex() == CALLER_TRACE and span.span_id == ROOT_ID.to_bytes(8, "big")
    assert span.parent_span_id.hex() == CALLER_SPAN and span.trace_state == "a=1,b=2" and span.name == "chat auto"
    assert span.kind == Span.SPAN_KIND_SERVER and (span.start_time_unix_nano, span.end_time_unix_nano) == (1_000, 5_000)
    assert span.flags == 0x301 and span.status.code == span.status.STATUS_CODE_ERROR
    assert span.status.message == "RuntimeError: boom"
    assert attributes(span) == {"k0": "chat", "k1": True, "k2": False, "k3": 0, "k4": -7, "k5": 2**40, "k6": 3.25,
                                "k7": 0.0, "k8": ["stop", "length"], "k9": [1, 2.5], "k10": b"\x00\x01",
                                "k11": "é" * 70, "k13": "short"}
    assert upstream.parent_span_id == ROOT_ID.to_bytes(8, "big") and upstream.kind == Span.SPAN_KIND_INTERNAL
    assert not upstream.trace_state and upstream.flags == 0x101 and upstream.status.code == 0
    assert attributes(upstream) == {"gateway.ttfb_ms": 12.5, "server.port": 8000}
    assert [(e.name, e.time_unix_nano) for e in upstream.events] == [("first_byte", 2_500), ("first_token", 3_000)]


def test_samplers_follow_the_sdk() -> None:
    from gateway.tracing.otel import Sampler

    low, high = (1 << 64) | 5, (0xFFFF << 64) | (3 << 62)  # low 64 bits: 5, and 0.75 of 2**64
    def decisions(environ: dict[str, str], ratio: float | None = None) -> tuple[bool, ...]:
        sampler = Sampler.configured(ratio, environ)
        return (sampler.sampled(low, None), sampler.sampled(high, None), sampler.sampled(high, True),
                sampler.sampled(low, False))

    assert decisions({}) == (True, True, True, False)  # default: parentbased_always_on
    assert decisions({"OTEL_TRACES_SAMPLER": "always_on"}) == (True, True, True, True)
    assert decisions({"OTEL_TRACES_SAMPLER": "always_off"}) == (False, False, False, False)
    assert decisions({"OTEL_TRACES_SAMPLER": "parentbased_always_off"}) == (False, False, True, False)
    ratio = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    assert decisions(ratio) == (True, False, False, True)  # the parent's flag does not count
    assert decisions({**ratio, "OTEL_TRACES_SAMPLER": "PARENTBASED_TRACEIDRATIO"}) == (True, False, True, False)
    assert decisions({**ratio, "OTEL_TRACES_SAMPLER_ARG": "lots"}) == (True, True, True, True)  # bad: 1.0
    assert decisions({"OTEL_TRACES_SAMPLER": "jaeger_remote"}) == (True, True, True, False)  # unknown: default
    assert decisions({"OTEL_TRACES_SAMPLER": "always_on"}, ratio=0.0) == (False, False, True, False)  # routes file


def test_traceparent_is_continued_only_when_valid() -> None:
    from gateway.tracing.otel import parse_traceparent

    good = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    assert parse_traceparent({"traceparent": good}) == (TRACE_ID, int(CALLER_SPAN, 16), True, "")
    assert parse_traceparent({"traceparent": good[:-1] + "2"}) == (TRACE_ID, int(CALLER_SPAN, 16), False, "")
    assert parse_traceparent({"traceparent": f"01-{CALLER_TRACE}-{CALLER_SPAN}-01-later"}) is not None
    for bad in (good.upper(), f"00-{'0' * 32}-{CALLER_SPAN}-01", f"00-{CALLER_TRACE}-{'0' * 16}-01",
                f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01", good + "-extra", good[:-1], "", good + " " * 600):
        assert parse_traceparent({"traceparent": bad}) is None, bad
    state = parse_traceparent({"traceparent": good, "tracestate": "vendor=x , other@sys=y:z,"})
    assert state is not None and state[3] == "vendor=x,other@sys=y:z"
    for bad_state in ("Upper=x", "a=1,a=2", ",".join(f"k{i}=v" for i in range(33))):
        found = parse_traceparent({"traceparent": good, "tracestate": bad_state})
        assert found is not None and found[3] == "", bad_state


async def test_traces_record_errors_and_send_the_right_traceparent() -> None:
    from gateway.config.routes import TracingSettings
    from gateway.context import RequestContext
    from gateway.testing import gateway_config, tier
    from gateway.tracing.otel import Tracing
    from gateway.types import JsonReply

    class AdmissionStage:
        async def __call__(self, ctx: RequestContext) -> None:
            ctx.queue_ms = 1.5

    class ProxyStage:
        async def __call__(self, ctx: RequestContext) -> JsonReply:
            raise RuntimeError("backend gone")

    exports: list[bytes] = []
    config = gateway_config([tier("t", ["http://127.0.0.1:9/v1"])])
    tracing = Tracing(TracingSettings(endpoint="http://127.0.0.1:9"), post=exports.append,
                      environ={"OTEL_SERVICE_NAME": "svc", "OTEL_RESOURCE_ATTRIBUTES": "team=llm,service.name=no"})
    try:
        caller = {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01", "tracestate": "v=1"}
        ctx = RequestContext("r1", "chat", config, b"", None, 0.0, 0.0)
        trace = tracing.start(caller, ctx)
        assert trace.recording and trace.headers() == {"traceparent": f"00-{CALLER_TRACE}-{trace.span_id:016x}-01",
                                                       "tracestate": "v=1"}
        await trace.stage("admission", AdmissionStage(), ctx)
        with pytest.raises(RuntimeError):
            await trace.stage("upstream", ProxyStage(), ctx)
        upstream = trace.headers()["traceparent"]
        ctx.result.status, ctx.result.outcome, ctx.result.error = 500, "internal_error", None
        trace.finish(ctx)
        trace.finish(ctx)  # once only
        unsampled = tracing.start({"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"}, ctx)
        assert not unsampled.recording
        assert unsampled.headers() == {"traceparent": f"00-{CALLER_TRACE}-{unsampled.span_id:016x}-00"}
        unsampled.finish(ctx)
        assert tracing.force_flush(5)
    finally:
        tracing.shutdown()
    resource, _, spans = _decoded(b"".join(exports))  # (one export: the flush came after both finished)
    assert resource["service.name"] == "svc" and resource["team"] == "llm"
    assert resource["telemetry.sdk.name"] == "gateway.tracing"
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"chat", "gateway.admission", "gateway.upstream"} and len(spans) == 3
    root, failed = by_name["chat"], by_name["gateway.upstream"]
    assert root.status.code == root.status.STATUS_CODE_ERROR and root.status.message == "internal_error"
    assert failed.status.message == "RuntimeError: backend gone" and upstream.split("-")[2] == failed.span_id.hex()
    assert attributes(by_name["gateway.admission"]) == {"gateway.queue_ms": 1.5}
    assert attributes(failed) == {"gateway.attempts": 0} and all(s.trace_state == "v=1" for s in spans)
    assert attributes(root)["http.response.status_code"] == 500 and root.flags & 0x200


def test_a_full_queue_drops_and_counts_without_waiting_and_shutdown_flushes() -> None:
    import threading
    import time

    from gateway.tracing.otlp import Encoder, Exporter
    from gateway.tracing.settings import ExportSettings

    entered, release, exports = threading.Event(), threading.Event(), []

    def slow_collector(body: bytes) -> None:
        entered.set()
        release.wait(10)
        exports.append(body)

    span = (TRACE_ID, ROOT_ID, 0, 0x101, "", "chat", 2, 1, 2, (), (), None, None)
    settings = ExportSettings(schedule_delay_s=0.01, max_queue_size=4, max_batch_size=2)
    exporter = Exporter(settings, Encoder({"service.name": "svc"}, "gateway"), post=slow_collector)
    exporter.submit([span, span])
    assert entered.wait(5)  # the thread took the first batch and waits on the collector
    began = time.perf_counter()
    for _ in range(5):
        exporter.submit([span, span])
    assert time.perf_counter() - began < 2.0 and exporter.dropped == 6  # did not wait for the collector (10 s); 4 queued, 6 turned away
    release.set()
    exporter.shutdown()
    assert exporter.exported == 6 and sum(len(_decoded(body)[2]) for body in exports) == 6
    exporter.submit([span])  # after shutdown: dropped, nothing raised
    assert exporter.dropped == 7


async def test_export_retries_and_reads_the_otlp_variables(start_app: StartApp) -> None:
    from gateway.tracing.otlp import Encoder, Exporter
    from gateway.tracing.settings import ExportSettings

    got: list[tuple[int, dict[str, str], bytes]] = []

    async def traces(request: web.Request) -> web.Response:
        got.append((len(got), dict(request.headers), await request.read()))
        if len(got) == 1:
            return web.Response(status=503, headers={"Retry-After": "0"})
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/custom/path", traces)
    url = await start_app(app)
    environ = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/custom/path", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1",
               "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s%20cret,bad", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
               "OTEL_BSP_SCHEDULE_DELAY": "20", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "5000"}
    settings = ExportSettings.from_environ(environ)
    assert settings.endpoint == f"{url}/custom/path" and settings.max_batch_size == settings.max_queue_size == 2048
    exporter = Exporter(settings, Encoder({"service.name": "svc"}, "gateway"))
    exporter.submit([(TRACE_ID, ROOT_ID, 0, 0x101, "", "chat", 2, 1, 2, ("k",), ("v",), None, None)])
    await asyncio.to_thread(exporter.force_flush, 10)
    await asyncio.to_thread(exporter.shutdown)
    assert len(got) == 2 and exporter.exported == 1 and exporter.failed == 0
    _, headers, body = got[1]
    assert headers["x-api-key"] == "s cret" and headers["Content-Type"] == "application/x-protobuf"
    assert headers["Content-Encoding"] == "gzip" and int(headers["Content-Length"]) != len(body)  # aiohttp inflates
    assert _decoded(body)[2][0].name == "chat"
    assert ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, None).endpoint \
        == "http://c:4318/v1/traces"
    assert ExportSettings.from_environ(environ, "http://routes:4318").endpoint == "http://routes:4318/v1/traces"
    for broken in ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"},  # no scheme
                   {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/nope"}):
        exporter = Exporter(ExportSettings.from_environ(broken), Encoder({}, "gateway"))  # runs, exports fail
        exporter.submit([(TRACE_ID, ROOT_ID, 0, 0x101, "", "chat", 2, 1, 2, (), (), None, None)])
        await asyncio.to_thread(exporter.shutdown)
        assert exporter.failed == 1 and exporter.exported == 0
