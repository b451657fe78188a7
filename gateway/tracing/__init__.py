"""OpenTelemetry traces of requests: off by default, and then nothing of gateway.tracing.otel is
imported and a request pays one `is None` test. On when the routes file has a `tracing` section or the
standard OTLP endpoint variable is set (OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it off).
The spans are exported over OTLP/HTTP (protobuf, or JSON) by the gateway's own exporter
(gateway.tracing.otlp), not the OpenTelemetry SDK; it reads the standard OTEL_* variables the SDK would
(sampler, propagators, service name, resource attributes, protocol, headers, timeout, compression,
certificates, batch sizes). OTLP/gRPC is not spoken: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is refused when the
gateway starts (`check_tracing`), rather than posting HTTP to a gRPC port and losing every span.

Which stages get a span of their own is said in the request path itself (gateway.pipeline's fields), with
the names below; the tracer knows what each one records, and that UPSTREAM is the call to the backend."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from gateway.config.routes import TracingSettings

if TYPE_CHECKING:
    from gateway.tracing.otel import RequestTrace, Tracing

__all__ = ["RequestTrace", "Tracing", "UnsupportedProtocol", "tracing_enabled", "open_tracing", "check_tracing",
           "export_protocol", "CLASSIFICATION", "CACHE", "ADMISSION", "UPSTREAM"]

# the stages' spans (gateway.<name>), as the request path declares them
CLASSIFICATION, CACHE, ADMISSION, UPSTREAM = "classification", "cache", "admission", "upstream"
PROTOCOLS = ("http/protobuf", "http/json")


class UnsupportedProtocol(ValueError):
    """OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL names a transport this exporter does not speak (grpc)."""


def export_protocol(environ: Mapping[str, str] = os.environ) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL: http/protobuf (the default) or
    http/json. grpc raises UnsupportedProtocol; another value is warned about and the default used, as the
    specification asks of an enum variable's unknown value."""
    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" if environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip() \
        else "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = environ.get(variable, "").strip().lower()
    if not value:
        return PROTOCOLS[0]
    if value == "grpc":
        raise UnsupportedProtocol(
            f"{variable}=grpc: the gateway exports traces over OTLP/HTTP only; set it to http/protobuf (or "
            "http/json) and point the endpoint at the collector's OTLP/HTTP port (4318 by default, not gRPC's 4317)")
    if value not in PROTOCOLS:
        structlog.get_logger("gateway.tracing").warning("tracing_bad_setting", variable=variable, value=value,
                                                        default=PROTOCOLS[0])
        return PROTOCOLS[0]
    return value


def check_tracing(settings: TracingSettings | None, environ: Mapping[str, str] = os.environ) -> None:
    """Raise UnsupportedProtocol when tracing is on with a protocol the exporter does not speak (called
    before the gateway starts serving, so the refusal is the command's error, not a failed startup)."""
    if tracing_enabled(settings, environ):
        export_protocol(environ)


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
