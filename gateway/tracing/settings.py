"""Where and how the trace exporter sends spans, from the standard OTEL_* variables as the OpenTelemetry
specification reads them (`ExportSettings.from_environ`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

import structlog

from gateway.tracing import export_protocol

log = structlog.get_logger("gateway.tracing")


def _env_number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning("tracing_bad_setting", variable=name, value=raw, default=default)
        return default


def _signal(environ: Mapping[str, str], name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_<name>, else OTEL_EXPORTER_OTLP_<name>."""
    return environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}") or None


def parse_key_values(text: str) -> dict[str, str]:
    """`k1=v1,k2=v2` (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES): percent-decoded and stripped;
    entries without `=` or with an empty key are skipped."""
    found = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = unquote(key).strip()
        if sep and key:
            found[key] = unquote(value).strip()
    return found


@dataclass(frozen=True)
class ExportSettings:
    """Where and how spans are exported, and the queue's bounds (the SDK's defaults)."""

    endpoint: str = "http://localhost:4318/v1/traces"
    protocol: str = "http/protobuf"  # or http/json
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0  # per export, its retries included
    compression: str = "none"  # none | gzip | deflate
    certificate: str | None = None  # CA bundle for https
    client_certificate: str | None = None
    client_key: str | None = None
    schedule_delay_s: float = 5.0  # the longest a finished span waits in the queue
    max_queue_size: int = 2048  # spans; more are dropped (and counted)
    max_batch_size: int = 512  # spans per export; a queue this long is sent at once
    shutdown_timeout_s: float = 30.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], endpoint: str | None = None) -> ExportSettings:
        """From the standard variables, as the specification reads them: OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT
        (the signal's used as is, the generic one + /v1/traces), _PROTOCOL (http/protobuf, http/json; grpc
        refused: gateway.tracing.export_protocol), _HEADERS, _TIMEOUT (milliseconds, as the specification
        says: the Python SDK reads seconds), _COMPRESSION, _CERTIFICATE, _CLIENT_CERTIFICATE, _CLIENT_KEY;
        OTEL_BSP_SCHEDULE_DELAY, OTEL_BSP_MAX_QUEUE_SIZE, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
        OTEL_BSP_EXPORT_TIMEOUT (milliseconds). `endpoint` (the routes file's collector base URL) comes
        before the variables."""
        if endpoint:
            url = f"{endpoint.rstrip('/')}/v1/traces"
        elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            url = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        else:
            url = f"{(environ.get('OTEL_EXPORTER_OTLP_ENDPOINT') or 'http://localhost:4318').rstrip('/')}/v1/traces"
        headers = {k.lower(): v for k, v in parse_key_values(_signal(environ, "HEADERS") or "").items()}
        compression = (_signal(environ, "COMPRESSION") or "none").strip().lower()
        if compression not in ("none", "gzip", "deflate"):
            log.warning("tracing_bad_setting", variable="OTEL_EXPORTER_OTLP_COMPRESSION", value=compression,
                        default="none")
            compression = "none"
        timeout = "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT" if environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") else \
            "OTEL_EXPORTER_OTLP_TIMEOUT"
        timeout_ms = max(1.0, _env_number(environ, timeout, 10000))
        if environ.get(timeout) and timeout_ms < 100:  # 10 meant as seconds (the Python SDK's reading) is 10 ms here
            log.warning("tracing_short_timeout", variable=timeout, milliseconds=timeout_ms)
        queue = max(1, int(_env_number(environ, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)))
        batch = max(1, int(_env_number(environ, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)))
        return cls(endpoint=url, protocol=export_protocol(environ), headers=headers,
                   timeout_s=timeout_ms / 1000, compression=compression,
                   certificate=_signal(environ, "CERTIFICATE"),
                   client_certificate=_signal(environ, "CLIENT_CERTIFICATE"), client_key=_signal(environ, "CLIENT_KEY"),
                   schedule_delay_s=max(1.0, _env_number(environ, "OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1000,
                   max_queue_size=queue, max_batch_size=min(batch, queue),
                   shutdown_timeout_s=max(0.0, _env_number(environ, "OTEL_BSP_EXPORT_TIMEOUT", 30000)) / 1000)
