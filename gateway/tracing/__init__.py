"""OpenTelemetry traces of requests: off by default, and then nothing of gateway.tracing.otel is
imported and a request pays one `is None` test. On when the routes file has a `tracing` section or the
standard OTLP endpoint variable is set (OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off).
The spans are exported over OTLP/HTTP (protobuf) by the gateway's own exporter (gateway.tracing.otlp),
not the OpenTelemetry SDK; it reads the standard OTEL_* variables the SDK would (sampler, service name,
resource attributes, headers, timeout, compression, certificates, batch sizes)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.config.routes import TracingSettings

if TYPE_CHECKING:
    from gateway.tracing.otel import RequestTrace, Tracing

__all__ = ["RequestTrace", "Tracing", "tracing_enabled", "open_tracing"]


def tracing_enabled(settings: TracingSettings | None, environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return settings is not None or any(
        environ.get(name) for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))


def open_tracing(settings: TracingSettings | None) -> Tracing | None:
    """The sampler and exporter when tracing is on, else None (and gateway.tracing.otel stays unimported)."""
    if not tracing_enabled(settings):
        return None
    from gateway.tracing.otel import Tracing

    return Tracing(settings or TracingSettings())
