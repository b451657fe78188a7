"""The OTLP/HTTP side of the trace exporter: one kept-alive connection to the collector, POSTs retried and
answers read as the OTLP specification's status table says (opentelemetry-proto docs/specification.md,
"OTLP/HTTP Response"):

    2xx                       exported; a `partial_success` in the body names spans the collector rejected
    429, 502, 503, 504        retried: after Retry-After when given, else exponential backoff with jitter
    no answer (connection)    retried the same way
    any other 4xx or 5xx      not retried: the batch is dropped and counted
    3xx                       not followed (the endpoint is a configured address, and a redirect can carry the
                              headers, credentials included, elsewhere): dropped and counted, the log names it
    1xx                       interim: read past (RFC 9110 §15.2), the final answer is the one that counts

The error message of a refusal (google.rpc.Status, protobuf or JSON) and of a partial success goes into
the log line."""

from __future__ import annotations

import gzip
import http.client
import random
import ssl
import threading
import time
import zlib
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
import structlog

from gateway.backends.urls import redact_url

if TYPE_CHECKING:
    from gateway.tracing.settings import ExportSettings

log = structlog.get_logger("gateway.tracing")

RETRYABLE = frozenset({429, 502, 503, 504})
MAX_ATTEMPTS = 6
CONTENT_TYPES = {"http/protobuf": "application/x-protobuf", "http/json": "application/json"}


class ExportFailed(Exception):
    """The batch was not accepted, for good (the reason is the message)."""


class PartiallyRejected(Exception):
    """The collector accepted the batch but for `rejected` spans (a 200 with `partial_success`)."""

    def __init__(self, rejected: int, message: str) -> None:
        super().__init__(message)
        self.rejected = rejected


class FinalResponse(http.client.HTTPResponse):
    """http.client reads past `100 Continue` only: another 1xx (103 Early Hints) would be taken as the
    answer, and the real one read by the next request on the connection. This reads past them all."""

    def _read_status(self) -> tuple[str, int, str]:
        while True:
            version, status, reason = super()._read_status()  # type: ignore[misc]
            if not 100 < status < 200 or status == 101:
                return version, status, reason
            http.client.parse_headers(self.fp)  # the interim answer's headers, dropped


class HttpPoster:
    """POST to the collector over one kept-alive connection, retrying as the table above says: a dropped
    kept-alive connection once at once, then up to 6 attempts within the export timeout; no waiting for a
    retry once stopping."""

    def __init__(self, settings: ExportSettings, user_agent: str, stopped: threading.Event) -> None:
        self.settings = settings
        self._stopped = stopped
        url = urlsplit(settings.endpoint)
        try:
            port = url.port
        except ValueError:
            port, url = None, urlsplit("")
        self._invalid = None if url.scheme in ("http", "https") and url.hostname else \
            f"the OTLP endpoint is not an http(s) URL: {redact_url(settings.endpoint)!r}"
        if self._invalid:  # as with the SDK, the gateway runs; each export fails (and says why)
            log.error("tracing_bad_endpoint", endpoint=redact_url(settings.endpoint))
        self._https = url.scheme == "https"
        # the port given explicitly: left out, http.client would take an IPv6 host's last `:1` for one
        self.host, self.port = url.hostname or "", port or (443 if self._https else 80)
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._headers = {"content-type": CONTENT_TYPES[settings.protocol], "user-agent": user_agent,
                         **settings.headers}
        if settings.compression != "none":
            self._headers.setdefault("content-encoding", settings.compression)
        self._ssl: ssl.SSLContext | None = None
        if self._https and not self._invalid:
            try:
                self._ssl = ssl.create_default_context(cafile=settings.certificate)
                if settings.client_certificate:
                    self._ssl.load_cert_chain(settings.client_certificate, settings.client_key)
            except (OSError, ssl.SSLError) as err:
                self._invalid = f"the OTLP certificates could not be loaded: {err}"
                log.error("tracing_bad_certificates", error=str(err))
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=self._ssl)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self._conn.response_class = FinalResponse
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, body: bytes, timeout: float) -> tuple[http.client.HTTPResponse, bytes]:
        """The answer to one POST, and its body; a stale kept-alive connection is retried once."""
        for attempt in (0, 1):
            try:
                conn = self._connection(timeout)
                conn.request("POST", self._path, body=body, headers=self._headers)
                response = conn.getresponse()
                content = response.read()
                if response.will_close:
                    self.close()
                return response, content
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def post(self, body: bytes) -> None:
        """Export one encoded batch: returns when it was accepted whole; raises PartiallyRejected when the
        collector kept only part of it, ExportFailed when it was not accepted."""
        if self._invalid:
            raise ExportFailed(self._invalid)
        if self.settings.compression == "gzip":
            body = gzip.compress(body, compresslevel=6)
        elif self.settings.compression == "deflate":
            body = zlib.compress(body)
        deadline = time.monotonic() + self.settings.timeout_s
        for attempt in range(MAX_ATTEMPTS):
            remaining = deadline - time.monotonic()
            backoff: float | None = None
            try:
                response, content = self._send(body, max(remaining, 0.001))
            except (OSError, http.client.HTTPException) as err:
                failure, retryable = f"{type(err).__name__}: {err}", True
            else:
                status = response.status
                if 200 <= status < 300:
                    _check_partial_success(response.getheader("content-type"), content)
                    return
                failure = f"HTTP {status} {response.reason}{_explained(response, content)}"
                retryable, backoff = status in RETRYABLE, _seconds(response.getheader("retry-after"))
            if backoff is None:
                backoff = 2 ** attempt * random.uniform(0.8, 1.2)
            if not retryable or attempt + 1 == MAX_ATTEMPTS or backoff > deadline - time.monotonic():
                raise ExportFailed(failure)
            log.info("trace_export_retry", reason=failure, retry_in_s=round(backoff, 2))
            if self._stopped.wait(backoff):
                raise ExportFailed(f"{failure} (not retried: shutting down)")
        raise ExportFailed("retries exhausted")


def _explained(response: http.client.HTTPResponse, content: bytes) -> str:
    """What a refusal says beyond its status: where a redirect points, the Status message of an error."""
    if 300 <= response.status < 400:
        location = response.getheader("location")
        return f" (a redirect{f' to {location}' if location else ''}: not followed; set the endpoint to " \
               "the collector's own address)"
    message = _status_message(response.getheader("content-type"), content)
    return f": {message}" if message else ""


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";")[0].strip().lower() == "application/json"


def _json(content: bytes) -> dict[str, Any]:
    try:
        found = orjson.loads(content)
    except orjson.JSONDecodeError:
        return {}
    return found if isinstance(found, dict) else {}


def _status_message(content_type: str | None, content: bytes) -> str:
    """google.rpc.Status.message (field 2) of an error answer, protobuf or JSON; '' when there is none."""
    if not content:
        return ""
    if _is_json(content_type):
        message = _json(content).get("message")
        return message if isinstance(message, str) else ""
    field = protobuf_fields(content).get(2)
    return field.decode("utf-8", "replace") if isinstance(field, bytes) else ""


def _check_partial_success(content_type: str | None, content: bytes) -> None:
    """Raise PartiallyRejected when an accepting answer's `partial_success` rejects spans; log its message
    when it only warns (rejected_spans 0)."""
    if not content:
        return
    rejected, message = 0, ""
    if _is_json(content_type):
        partial = _json(content).get("partialSuccess")
        if isinstance(partial, dict):
            try:
                rejected = int(partial.get("rejectedSpans") or 0)
            except (TypeError, ValueError):
                rejected = 0
            message = str(partial.get("errorMessage") or "")
    else:
        partial = protobuf_fields(content).get(1)
        if isinstance(partial, bytes):
            fields = protobuf_fields(partial)
            count, text = fields.get(1), fields.get(2)
            rejected = count if isinstance(count, int) else 0
            message = text.decode("utf-8", "replace") if isinstance(text, bytes) else ""
    if rejected > 0:
        raise PartiallyRejected(rejected, message)
    if message:
        log.warning("trace_export_warning", message=message)


def protobuf_fields(data: bytes) -> dict[int, int | bytes]:
    """The last value of each field of a protobuf message (varints as int, length-delimited as bytes, fixed
    ones skipped); whatever cannot be read ends the reading (what was read stays)."""
    found: dict[int, int | bytes] = {}
    i, end = 0, len(data)
    try:
        while i < end:
            key, i = _varint(data, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                found[number], i = _varint(data, i)
            elif wire == 2:
                size, i = _varint(data, i)
                if i + size > end:
                    break
                found[number], i = data[i:i + size], i + size
            elif wire in (1, 5):
                i += 8 if wire == 1 else 4
            else:
                break
    except IndexError:
        pass
    return found


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 127) << shift
        if byte < 128:
            return value, i
        shift += 7


def _seconds(retry_after: str | None) -> float | None:
    """Retry-After in seconds: delay-seconds or an HTTP date (None: absent or unreadable, back off as usual)."""
    if retry_after is None:
        return None
    try:
        seconds = float(retry_after.strip())
    except ValueError:
        try:
            seconds = parsedate_to_datetime(retry_after).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    return max(seconds, 0.0) if seconds == seconds else None
