"""OTLP/JSON encoding of a batch of spans (OTEL_EXPORTER_OTLP_PROTOCOL=http/json): the protobuf JSON mapping
with OTLP's deviations (opentelemetry-proto docs/specification.md, "JSON Protobuf Encoding"): trace and span
ids as hex strings, enums as integers, lowerCamelCase keys; 64-bit integers as decimal strings, bytes as
base64, non-finite doubles as "NaN", "Infinity", "-Infinity". Slower than the protobuf encoder (nothing
cached): http/protobuf is the default and the one to use at volume."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import structlog

from gateway.tracing.otlp import STATUS_ERROR, SpanRecord, plain_value, valid_text

log = structlog.get_logger("gateway.tracing")

_INT64, _SIGN = (1 << 64) - 1, 1 << 63
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def any_value(value: Any) -> dict[str, Any]:
    """An AnyValue as JSON (the same types as the protobuf encoder's any_value, the same fallbacks)."""
    kind = type(value)
    if kind is str:
        return {"stringValue": value}
    if kind is bool:
        return {"boolValue": value}
    if kind is int:
        n = value & _INT64  # as the protobuf encoder wraps it: the int64 it decodes to
        return {"intValue": str(n - (1 << 64) if n & _SIGN else n)}
    if kind is float:
        return {"doubleValue": value if math.isfinite(value) else _NON_FINITE.get(value, "NaN")}
    if isinstance(value, (list, tuple)):
        return {"arrayValue": {"values": [any_value(item) for item in value]}}
    if isinstance(value, (bytes, bytearray)):
        return {"bytesValue": base64.b64encode(bytes(value)).decode()}
    return any_value(plain_value(value))


def attributes(keys: Iterable[str], values: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"key": key, "value": any_value(value)} for key, value in zip(keys, values) if value is not None]


class JsonEncoder:
    """ExportTraceServiceRequest as OTLP/JSON for a batch of spans of one resource and one scope."""

    def __init__(self, resource: Mapping[str, Any], scope: str) -> None:
        self.unencodable = 0  # spans left out of their batch: they could not be encoded
        self._resource = {"attributes": attributes(resource.keys(), resource.values())}
        self._scope = {"name": scope}

    def request(self, spans: Iterable[SpanRecord]) -> bytes:
        encoded = []
        for span in spans:
            try:
                encoded.append(self._span(span))
            except Exception:  # this span only: the batch goes without it
                self.unencodable += 1
                log.exception("trace_span_unencodable", name=span[5] if len(span) > 5 else None)
        body = {"resourceSpans": [{"resource": self._resource,
                                   "scopeSpans": [{"scope": self._scope, "spans": encoded}]}]}
        try:
            return orjson.dumps(body)
        except orjson.JSONEncodeError:  # a lone surrogate somewhere: U+FFFD in its place
            return orjson.dumps(_valid(body))

    @staticmethod
    def _span(span: SpanRecord) -> dict[str, Any]:
        trace_id, span_id, parent_id, flags, trace_state, name, kind, start, end, keys, values, events, error = span
        found: dict[str, Any] = {"traceId": f"{trace_id:032x}", "spanId": f"{span_id:016x}"}
        if trace_state:
            found["traceState"] = trace_state
        if parent_id:
            found["parentSpanId"] = f"{parent_id:016x}"
        found.update(flags=flags, name=name, kind=kind, startTimeUnixNano=str(start), endTimeUnixNano=str(end))
        if keys:
            found["attributes"] = attributes(keys, values)
        if events:
            found["events"] = [{"timeUnixNano": str(at), "name": event} for event, at in events]
        if error is not None:
            found["status"] = {"code": STATUS_ERROR, **({"message": error} if error else {})}
        return found


def _valid(value: Any) -> Any:
    """value with every string in it made valid UTF-8 (lone surrogates replaced by U+FFFD)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {_valid(key): _valid(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_valid(item) for item in value]
    return value
