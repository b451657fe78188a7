"""Tiers that serve /v1/responses themselves (routes: `native: [responses]`, e.g. vLLM): the request goes
upstream as the client sent it (model and the tenant's max_output_tokens set), the answer comes back untouched,
and these read from it what accounting and the cache need, as the chat path's scanner and settle do.
Limits: the output cap stops a native stream (upstream cancelled) without a `response.incomplete` event of
the gateway's own; a non-streamed native answer's text is cut to the character cap by the proxy stage
(status "incomplete", reason max_output_tokens). A Responses request asks for one output.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.context import RequestContext
from gateway.sse import SseScanner

FINISHED = frozenset({"response.completed", "response.incomplete"})


def is_native(ctx: RequestContext) -> bool:
    """Whether this request goes to its tier in its own protocol (a cache hit is a chat answer: translated)."""
    return (ctx.wire is not None and ctx.route.tier is not None and ctx.wire.name in ctx.route.tier.native
            and ctx.cache not in ("hit", "semantic_hit"))


def upstream_body(ctx: RequestContext, model: str) -> dict[str, Any]:
    """The client's Responses body for the replica: its model, the tenant's output limit."""
    return {**orjson.loads(ctx.raw_body), "model": model, "max_output_tokens": ctx.max_tokens}


def settle(ctx: RequestContext, response: dict[str, Any]) -> str | None:
    """Write a Responses object's usage and finish into the context; the answer's text (None: no text)."""
    if not isinstance(response, dict):
        raise TypeError("not a response object")
    usage = response.get("usage")
    if isinstance(usage, dict):
        ctx.upstream.reported(usage.get("input_tokens"), usage.get("output_tokens"))
    ctx.upstream.finished("length" if response.get("status") == "incomplete" else "stop")
    texts = [part.get("text") for item in response.get("output") or () if isinstance(item, dict)
             for part in item.get("content") or () if isinstance(part, dict) and part.get("type") == "output_text"]
    return "".join(t for t in texts if isinstance(t, str)) if texts else None


class ResponsesScanner(SseScanner):
    """Tallies a Responses event stream (text deltas, the final usage) and forwards it byte for byte; the
    stream is done at `response.completed` / `response.incomplete`, which it forwards (no [DONE] follows)."""

    def _tally_chunk(self, event: dict[str, Any], raw: bytes) -> bytes | None:
        kind = event.get("type")
        if kind == "response.output_text.delta" and isinstance(delta := event.get("delta"), str):
            self._count(delta)
        elif kind in FINISHED and isinstance(response := event.get("response"), dict):
            usage = response.get("usage") or {}
            self.tally.usage = {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get(
                "output_tokens")}
            self.tally.finish_reason = "stop" if kind == "response.completed" else "length"
            self.tally.done = True
        return raw

    def _count(self, delta: str) -> None:
        tally = self.tally
        tally.content_chunks += 1
        tally.content_chars += len(delta)
        if tally.first_token_at is None:
            tally.first_token_at = time.perf_counter()
        if tally.text is not None:
            tally.text.append(delta)
        limit = self._limit
        if limit is not None and ((limit.tokens is not None and tally.content_chunks >= limit.tokens)
                                  or (limit.chars is not None and tally.content_chars >= limit.chars)):
            tally.capped = True

    def ending(self, reason: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        return b""  # the backend's own last event was forwarded
