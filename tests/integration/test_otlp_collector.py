"""The trace exporter against a collector on loopback, answer by answer, as the OTLP/HTTP specification's
status table says (opentelemetry-proto docs/specification.md, "OTLP/HTTP Response"). No OpenTelemetry
Collector installs from the package registries here (Debian has only the Go libraries, npm none, and the one
PyPI wheel shipping an otelcol binary has no OTLP receiver in its build), so the collector is this test's:
it decodes each export with opentelemetry-proto (protobuf, or JSON as the specification maps it) and
answers from a script."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTracePartialSuccess, \
    ExportTraceServiceRequest, ExportTraceServiceResponse
from structlog.testing import capture_logs

from gateway.tracing.otlp import Encoder, Exporter, SpanRecord
from gateway.tracing.settings import ExportSettings
from tests.conftest import StartApp
from tests.unit.test_otlp import from_json

TRACE = int("4bf92f3577b34da6a3ce929d0e0e4736", 16)
Answer = tuple[int, dict[str, str], bytes]  # status, headers, body


def spans(n: int) -> list[SpanRecord]:
    return [(TRACE, i + 1, 0, 0x101, "", f"span{i}", 2, 1, 2, ("k",), ("v",), None, None) for i in range(n)]


def partial(rejected: int, message: str) -> bytes:
    return ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
        rejected_spans=rejected, error_message=message)).SerializeToString()


class Collector:
    """POST /v1/traces: decodes the export (by its Content-Type), then answers the next scripted answer, or
    200 with an empty ExportTraceServiceResponse when the script is done."""

    def __init__(self, *answers: Answer, delay_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.delay_s = delay_s
        self.requests: list[tuple[str, ExportTraceServiceRequest]] = []

    async def traces(self, request: web.Request) -> web.Response:
        body, content_type = await request.read(), request.headers.get("Content-Type", "")
        if content_type == "application/json":
            export = from_json(body)
        else:
            export = ExportTraceServiceRequest.FromString(body)
        self.requests.append((content_type, export))
        await asyncio.sleep(self.delay_s)
        if self.answers:
            status, headers, answer = self.answers.pop(0)
            return web.Response(status=status, headers=headers, body=answer)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type=content_type)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self.traces)
        return app

    def span_names(self) -> list[str]:
        return [s.name for _, e in self.requests for rs in e.resource_spans for ss in rs.scope_spans for s in ss.spans]


async def export(endpoint: str, batch: list[SpanRecord], **settings: Any) -> tuple[Exporter, list[dict[str, Any]]]:
    """One export of `batch` through the real HTTP poster; the exporter (its counts) and the log."""
    exporter = Exporter(ExportSettings(endpoint=endpoint, schedule_delay_s=0.01, **settings),
                        Encoder({"service.name": "svc"}, "gateway"))
    with capture_logs() as logs:
        exporter.submit(batch)
        await asyncio.to_thread(exporter.force_flush, 10)  # (retries are cut short once shutting down)
        await asyncio.to_thread(exporter.shutdown)
    return exporter, logs


REDIRECT = {"Location": "http://elsewhere:4318/v1/traces"}
STATUS_TABLE = [
    # (answers, requests the collector gets, spans exported, spans failed)
    ([(200, {}, b"")], 1, 3, 0),
    ([(202, {}, b"")], 1, 3, 0),
    ([(200, {"Content-Type": "application/x-protobuf"}, partial(2, "two too old"))], 1, 1, 2),
    ([(200, {"Content-Type": "application/x-protobuf"}, partial(0, "deprecated field"))], 1, 3, 0),
    ([(200, {"Content-Type": "application/json"},
       b'{"partialSuccess": {"rejectedSpans": "2", "errorMessage": "two too old"}}')], 1, 1, 2),  # OTLP/JSON
    *[([(status, REDIRECT, b"")], 1, 0, 3) for status in (301, 302, 303, 307, 308)],  # not followed, not retried
    *[([(status, {}, b"")], 1, 0, 3) for status in (400, 401, 403, 404, 413, 500, 501)],  # not retried
    *[([(status, {"Retry-After": "0"}, b"")], 2, 3, 0) for status in (429, 502, 503, 504)],  # retried
    ([(503, {"Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"}, b"")], 2, 3, 0),  # a date in the past: at once
]


@pytest.mark.parametrize(("answers", "requests", "exported", "failed"), STATUS_TABLE,
                         ids=[f"{a[0][0]}-{i}" for i, (a, *_) in enumerate(STATUS_TABLE)])
async def test_each_answer_is_taken_as_the_status_table_says(start_app: StartApp, answers: list[Answer],
                                                             requests: int, exported: int, failed: int) -> None:
    collector = Collector(*answers)
    url = await start_app(collector.app())
    exporter, logs = await export(f"{url}/v1/traces", spans(3))
    assert (len(collector.requests), exporter.exported, exporter.failed) == (requests, exported, failed)
    events = {e["event"]: e for e in logs}
    status = answers[0][0]
    if 300 <= status < 400:
        assert "not followed" in events["trace_export_failed"]["reason"] and REDIRECT["Location"] in \
            events["trace_export_failed"]["reason"]
    if failed and status == 200:
        assert events["trace_spans_rejected"]["reason"] == "two too old"
    if answers[0][2] == partial(0, "deprecated field"):
        assert events["trace_export_warning"]["message"] == "deprecated field"


async def test_the_error_message_of_a_refusal_is_logged(start_app: StartApp) -> None:
    status = b"\x08\x03\x12\x12span 7 has no name"  # google.rpc.Status: code 3 (field 1), message (field 2)
    collector = Collector((400, {"Content-Type": "application/x-protobuf"}, status))
    url = await start_app(collector.app())
    exporter, logs = await export(f"{url}/v1/traces", spans(1))
    assert exporter.failed == 1
    assert [e["reason"] for e in logs if e["event"] == "trace_export_failed"] == \
        ["HTTP 400 Bad Request: span 7 has no name"]


async def test_http_json_is_posted_as_otlp_json(start_app: StartApp) -> None:
    collector = Collector()
    url = await start_app(collector.app())
    from gateway.tracing.otlp_json import JsonEncoder

    exporter = Exporter(ExportSettings(endpoint=f"{url}/v1/traces", protocol="http/json", schedule_delay_s=0.01),
                        JsonEncoder({"service.name": "svc"}, "gateway"))
    exporter.submit(spans(2))
    await asyncio.to_thread(exporter.force_flush, 10)
    await asyncio.to_thread(exporter.shutdown)
    assert exporter.exported == 2 and collector.span_names() == ["span0", "span1"]
    assert collector.requests[0][0] == "application/json"


async def test_an_interim_1xx_answer_is_read_past() -> None:
    """A collector (or a proxy before it) that sends 103 Early Hints, then its answer: the 103 is not the
    answer, and the answer is not left on the kept-alive connection for the next export to read."""
    got: list[bytes] = []

    async def scripted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\n"
                       b"Content-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n",
                       b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            got.append(await reader.readexactly(length))
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(scripted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        exporter = Exporter(ExportSettings(endpoint=f"http://127.0.0.1:{port}/v1/traces",
                                           schedule_delay_s=3600), Encoder({}, "gateway"))
        exporter.submit(spans(2))
        assert await asyncio.to_thread(exporter.force_flush, 10)
        assert (exporter.exported, exporter.failed) == (2, 0)  # the 200 after the 103
        exporter.submit(spans(1))
        await asyncio.to_thread(exporter.shutdown)
        assert (exporter.exported, exporter.failed) == (2, 1)  # the second export's own answer: 400
        assert len(got) == 2
    finally:
        server.close()
        await server.wait_closed()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
async def test_an_ipv6_collector_gets_the_spans() -> None:
    collector = Collector()
    runner = web.AppRunner(collector.app())
    await runner.setup()
    site = web.TCPSite(runner, "::1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        exporter, _ = await export(f"http://[::1]:{port}/v1/traces", spans(2))
        assert exporter.exported == 2 and collector.span_names() == ["span0", "span1"]
    finally:
        await runner.cleanup()


async def test_the_timeout_variable_is_read_in_milliseconds(start_app: StartApp) -> None:
    collector = Collector(delay_s=3.0)  # slower than 300 ms, far quicker than 300 s
    url = await start_app(collector.app())
    settings = ExportSettings.from_environ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces",
                                            "OTEL_EXPORTER_OTLP_TIMEOUT": "300", "OTEL_BSP_SCHEDULE_DELAY": "10"})
    began = time.monotonic()
    exporter = Exporter(settings, Encoder({}, "gateway"))
    exporter.submit(spans(1))
    await asyncio.to_thread(exporter.force_flush, 10)
    elapsed = time.monotonic() - began
    await asyncio.to_thread(exporter.shutdown)
    assert exporter.failed == 1 and exporter.exported == 0 and elapsed < 2.5


def test_gateway_serve_refuses_grpc_with_the_reason() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    done = subprocess.run([sys.executable, "-m", "gateway", "serve", "--port", "9"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "gateway listening" not in done.stderr
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: the gateway exports traces over OTLP/HTTP only" in done.stderr

