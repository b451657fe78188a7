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
    def value(v: AnyValue) -> Any:
        kind = v.WhichOneof("value")
        if kind == "array_value":
            return [value(item) for item in v.array_value.values]
        return getattr(v, kind) if kind else None
    return {a.key: value(a.value) for a in span.attributes}


async def started(start_app: StartApp, routes: dict[str, Any] | None = None, redis_url: str | None = None
                  ) -> tuple[str, Receiver, list[str]]:
    """A receiver, an emulator that records the traceparent headers it gets, and a traced gateway."""
    receiver = Receiver()
    collector = await start_app(receiver.app())
    seen: list[str] = []

    @web.middleware
    async def record(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        seen.append(request.headers.get("traceparent", ""))
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
        assert (root.trace_id.hex(), upstream.span_id.hex(), True) in [parsed(header) for header in seen]


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
    unsampled, continued = (parsed(header) for header in seen)
    assert unsampled[0] != CALLER_TRACE and not unsampled[2]  # still propagated, flagged not sampled
    assert continued[0] == CALLER_TRACE and continued[2]


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
