"""OpenTelemetry traces of requests: off by default, and then nothing of OpenTelemetry is imported
and a request pays one `is None` test. On when the routes file has a `tracing` section or the standard
OTLP endpoint variable is set (OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off).
The SDK itself reads the other OTEL_* variables (sampler, service name, headers, batch sizes)."""

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
    """The tracer provider and exporter when tracing is on, else None (and OpenTelemetry stays unimported)."""
    if not tracing_enabled(settings):
        return None
    from gateway.tracing.otel import Tracing

    return Tracing(settings or TracingSettings())
