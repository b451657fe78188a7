"""One chat request, timed: streaming (TTFT, inter-token latencies, TPOT, E2E) or not (E2E).

TTFT is the time from sending the request to the first SSE event whose `choices[0].delta.content`
is non-empty; ITL the gaps between successive content events; TPOT = (E2E - TTFT) / (output
tokens - 1), as `vllm bench serve` defines them. Output tokens come from the `usage` chunk
(requested with `stream_options.include_usage`), else one per content event. A non-streaming
request (`send_json`) is ok when it answers 200 with `choices`; its TTFT is its E2E latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from gateway.bench.workload import RequestSpec

KEPT_HEADERS = ("x-gateway-backend", "x-gateway-tier", "x-gateway-cache", "x-gateway-difficulty",
                "x-request-id", "retry-after")


@dataclass(slots=True)
class RequestResult:
    """What one request measured. Times in seconds; `start_s` on the runner's clock."""

    ok: bool
    status: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    tpot_s: float | None = None
    e2e_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    start_s: float = 0.0
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    conversation_id: str = ""
    turn: int = 0
    content_events: int = 0  # SSE events with content (streaming)
    index: int = -1  # the request's position in its run (set by the runners)

    @property
    def cache(self) -> str | None:
        """x-gateway-cache: hit, miss, ..."""
        return self.headers.get("x-gateway-cache")

    @property
    def tier(self) -> str | None:
        return self.headers.get("x-gateway-tier")

    @property
    def difficulty(self) -> float | None:
        value = self.headers.get("x-gateway-difficulty")
        return float(value) if value else None


def request_body(spec: RequestSpec, model: str, ignore_eos: bool, extra: Mapping[str, Any] | None) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": list(spec.messages), "max_tokens": spec.max_tokens,
                            "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        body["ignore_eos"] = True
    body.update(extra or {})
    return orjson.dumps(body)


def request_headers(api_key: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(extra or {})
    return headers


def _content(event: Any) -> str:
    choices = event.get("choices") if isinstance(event, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return ""
    delta = choices[0].get("delta") or {}
    return str(delta.get("content") or "") if isinstance(delta, dict) else ""


async def _read_stream(resp: aiohttp.ClientResponse, t0: float, result: RequestResult) -> None:
    last = t0
    events = 0
    usage: dict[str, Any] | None = None
    async for line in resp.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            result.ok = events > 0
            result.error = None if result.ok else "no content event"
            break
        event = orjson.loads(data)
        if isinstance(event, dict) and event.get("error"):
            result.error = str(event["error"])[:200]
            return
        if isinstance(event, dict) and event.get("usage"):
            usage = event["usage"]
        if _content(event):
            now = time.perf_counter()
            if result.ttft_s is None:
                result.ttft_s = now - t0
            else:
                result.itl_s.append(now - last)
            last, events = now, events + 1
    else:
        result.error = "stream ended without [DONE]"
    result.content_events = events
    result.output_tokens = int(usage.get("completion_tokens") or events) if usage else events
    if usage and usage.get("prompt_tokens"):
        result.prompt_tokens = int(usage["prompt_tokens"])


def _new_result(spec: RequestSpec | None, start_s: float) -> RequestResult:
    if spec is None:
        return RequestResult(False, start_s=start_s)
    return RequestResult(False, prompt_tokens=spec.prompt_tokens, start_s=start_s,
                         conversation_id=spec.conversation_id, turn=spec.turn)


def _http_error(status: int, data: bytes) -> str:
    return f"HTTP {status}: {data[:200].decode(errors='replace')}"


Reader = Callable[[aiohttp.ClientResponse, float, RequestResult], Awaitable[None]]


async def _request(session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str],
                   spec: RequestSpec | None, start_s: float, read: Reader) -> RequestResult:
    """POST `body`; a 200 answer is read by `read(response, t0, result)`; E2E timed; never raises."""
    result = _new_result(spec, start_s)
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            result.status = resp.status
            result.headers = {k: resp.headers[k] for k in KEPT_HEADERS if k in resp.headers}
            if resp.status != 200:
                result.error = _http_error(resp.status, await resp.read())
            else:
                await read(resp, t0, result)
    except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, ValueError) as err:
        result.ok, result.error = False, f"{type(err).__name__}: {err}"[:200]
    result.e2e_s = time.perf_counter() - t0
    return result


async def _read_json(resp: aiohttp.ClientResponse, t0: float, result: RequestResult) -> None:
    data = await resp.read()
    answer = orjson.loads(data)
    result.ok = isinstance(answer, dict) and bool(answer.get("choices"))
    result.error = None if result.ok else f"no choices: {data[:200].decode(errors='replace')}"
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if isinstance(usage, dict):
        result.output_tokens = int(usage.get("completion_tokens") or 0)
        result.prompt_tokens = int(usage.get("prompt_tokens") or result.prompt_tokens)


async def send(session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str],
               spec: RequestSpec | None = None, start_s: float = 0.0) -> RequestResult:
    """POST `body` to `url` (…/chat/completions), read the stream, time it; never raises."""
    result = await _request(session, url, body, headers, spec, start_s, _read_stream)
    if result.ok and result.ttft_s is not None and result.output_tokens > 1:
        result.tpot_s = (result.e2e_s - result.ttft_s) / (result.output_tokens - 1)
    return result


async def send_json(session: aiohttp.ClientSession, url: str, body: bytes, headers: Mapping[str, str],
                    spec: RequestSpec | None = None, start_s: float = 0.0) -> RequestResult:
    """POST a non-streaming `body` to `url`, read the answer, time it; never raises. Ok: 200 with
    `choices`; the usage, when given, sets the token counts; TTFT is the E2E latency."""
    result = await _request(session, url, body, headers, spec, start_s, _read_json)
    if result.ok:
        result.ttft_s = result.e2e_s
    return result
