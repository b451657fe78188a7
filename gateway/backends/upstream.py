"""One HTTP attempt at a replica, whatever it serves: the POST with the replica's own key, its answer read
in full, and the failures sorted into those worth another replica (`Retry`) and those that are final.

    response = await post(client, replica, "/embeddings", body, settings.upstream)  # a 200, or raises
    data = await read_answer(response, replica)
    status, body = await fetch(client, replica, "/models", timeout_s=2.0)  # a probe: GET, the same TLS and DNS

Connection errors, timeouts and 408/429/5xx raise `Retry` (the replica's fault: try the next one);
another 4xx raises `UpstreamStatus` with the backend's message (the request's fault: no replica would
take it). Only the replica's key from config goes upstream, never a client header.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlsplit

import orjson

from gateway.backends.h1 import ClientFailure, ConnectTimeout, Response, UpstreamClient, header_lines
from gateway.config import Replica
from gateway.config.routes import Upstream
from gateway.errors import GatewayError, UpstreamError, UpstreamOverloaded, UpstreamStatus, UpstreamTimeout

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_ERROR_BODY = 64 * 1024
USER_AGENT = "llm-gateway/0.1 (+httptools)"  # some front ends refuse a request without one
_KEYED_HEADERS: dict[str | None, str] = {}  # by the replica's key: the header lines every request to it sends


class Retry(Exception):
    """This replica failed before answering; try the next one."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.message)
        self.error = error


def _replica_headers(api_key: str | None) -> str:
    lines = _KEYED_HEADERS.get(api_key)
    if lines is None:
        keyed = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if api_key is not None:
            keyed["Authorization"] = f"Bearer {api_key}"
        lines = _KEYED_HEADERS[api_key] = header_lines(keyed)
    return lines


async def post(client: UpstreamClient, replica: Replica, path: str, body: bytes, settings: Upstream,
               headers: Mapping[str, str] | None = None) -> Response:
    """POST `body` (JSON) to `replica.url + path`, with the replica's own key and `headers` (trace context);
    the response when it is a 200, else raises `Retry` or the final error. The connection within
    `settings.connect_timeout_s`; the head, then each read of the body, within `read_timeout_s`."""
    try:
        lines = _replica_headers(replica.api_key)
        if headers:
            lines += header_lines(dict(headers))
        response = await client.post(replica.url, path, body, lines, connect_s=settings.connect_timeout_s,
                                     read_s=settings.read_timeout_s, tls=replica.tls_context)
    except ValueError as err:  # a header value or path HTTP/1.1 cannot carry: this replica is not sent it
        raise Retry(UpstreamError(f"cannot send the request to backend {replica.name}: {err}")) from None
    except ConnectTimeout:
        raise Retry(UpstreamTimeout(f"backend {replica.name} did not connect in time")) from None
    except TimeoutError:  # connected, but no response head within read_timeout_s (a stuck or busy backend)
        raise Retry(UpstreamTimeout(f"backend {replica.name} sent no first byte in time")) from None
    except ClientFailure as err:
        raise Retry(UpstreamError(f"backend {replica.name} is unreachable: {type(err).__name__}")) from None
    if response.status == 200:
        return response
    error = await status_error(response, replica)
    raise Retry(error) if response.status in RETRYABLE_STATUS else error


async def fetch(client: UpstreamClient, replica: Replica, path: str, timeout_s: float, *,
                root: bool = False) -> tuple[int, bytes]:
    """GET `replica.url + path` (`root`: the path at the server's root, as /metrics) with the replica's own key,
    TLS, name cache and pooled connections, like its requests: (status, body), all within `timeout_s`. Raises
    `ClientFailure`, `TimeoutError`, or `ValueError` for a URL HTTP/1.1 cannot carry."""
    base = _root(replica.url) if root else replica.url
    async with asyncio.timeout(timeout_s):
        response = await client.get(base, path, _replica_headers(replica.api_key), connect_s=timeout_s,
                                    read_s=timeout_s, tls=replica.tls_context)
        try:
            return response.status, await response.read()
        finally:
            response.close()  # a no-op once read whole (the connection is back in the pool)


def _root(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


async def read_answer(response: Response, replica: Replica) -> bytes:
    """The whole body of a non-streamed answer (`Retry` when it breaks off or stalls)."""
    try:
        return await response.read()
    except TimeoutError:
        raise Retry(UpstreamTimeout(f"backend {replica.name} did not answer in time")) from None
    except ClientFailure as err:
        raise Retry(UpstreamError(f"backend {replica.name} broke off its answer: {type(err).__name__}")) from None


async def status_error(response: Response, replica: Replica) -> GatewayError:
    """Turn an upstream non-200 into our error, keeping the upstream's message for 4xx."""
    raw = b""
    try:
        while len(raw) < MAX_ERROR_BODY and (chunk := await response.readany()):
            raw += chunk
    except ClientFailure:
        pass
    finally:
        response.release()
    raw = raw[:MAX_ERROR_BODY]
    message = _message_of(raw)
    retry_after = response.headers.get("retry-after")
    delay = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
    if response.status == 429:
        return UpstreamOverloaded(f"backend {replica.name} is rate limiting (429): {message}", retry_after=delay)
    if response.status >= 500 or response.status in RETRYABLE_STATUS:
        return UpstreamError(f"backend {replica.name} answered {response.status}: {message}", retry_after=delay)
    return UpstreamStatus(response.status, f"the backend refused the request: {message}", retry_after=delay)


def _message_of(raw: bytes) -> str:
    """The error message of an upstream body: OpenAI's {"error": {"message"}}, TEI's {"error": "..."},
    older vLLM's {"message"}; else the body's first 500 characters."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error if error else data.get("message")
        if isinstance(message, str):
            return message
    return raw.decode("utf-8", "replace")[:500]
