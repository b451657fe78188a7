"""SseRelay: streams an upstream SSE response to the client and settles the request when done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson

from gateway.backends.idle import IdleWatchdog
from gateway.context import RequestContext
from gateway.sse import SseScanner


def error_event(message: str, code: str) -> bytes:
    """An SSE event carrying an OpenAI error object: how a stream that already started says it failed."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


class SseRelay:
    def __init__(
        self,
        ctx: RequestContext,
        response: aiohttp.ClientResponse,
        scanner: SseScanner,
        first: bytes,
        on_close: Callable[[bool], None],
        watchdog: IdleWatchdog,
        idle_s: float,
    ) -> None:
        self._ctx = ctx
        self._response = response
        self._scanner = scanner
        self._first = first
        self._on_close = on_close
        self._closed = False
        self._idle = False
        self._watchdog = watchdog
        self.idle_s = idle_s
        self.last_read = time.monotonic()
        connection = response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None  # the watchdog keeps the idle timeout from here on
            connection.protocol.start_timeout()  # with no timeout set, this cancels the armed timer
        watchdog.watch(self)

    async def chunks(self) -> AsyncIterator[bytes]:
        scanner = self._scanner
        out = scanner.feed(self._first)
        if out:
            yield out
        if scanner.tally.capped:
            yield self._cap()
            return
        try:
            async for data in self._response.content.iter_any():
                self.last_read = time.monotonic()
                out = scanner.feed(data)
                if out:
                    yield out
                if scanner.tally.capped:
                    yield self._cap()
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            if self._idle:
                yield self._fail(f"the backend sent nothing for {self.idle_s:g} s", "upstream_idle_timeout")
            else:
                yield self._fail(f"the backend stream broke off: {type(err).__name__}", "upstream_stream_broken")
            return
        if not scanner.tally.done:
            yield self._fail("the backend stream ended before [DONE]", "upstream_stream_truncated")

    def abort_idle(self) -> None:
        """Called by the watchdog: the backend went quiet for too long; the read loop then fails."""
        self._idle = True
        self._response.close()

    def _cap(self) -> bytes:
        """The output cap was reached: end the client's stream; `close` then cancels the upstream."""
        self._ctx.output_capped = True
        return self._scanner.ending()

    def _fail(self, message: str, code: str) -> bytes:
        self._ctx.outcome = "upstream_error"
        self._ctx.error = code
        return error_event(message, code)

    def close(self) -> None:
        """Settle the context from what the stream said, and release (or abort) the upstream."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.forget(self)
        tally, ctx = self._scanner.tally, self._ctx
        ctx.first_token_at = tally.first_token_at
        ctx.finish_reason = "length" if tally.capped else tally.finish_reason
        ctx.output_chunks = tally.content_chunks
        if tally.text is not None:
            ctx.response_text = "".join(tally.text)
        if tally.malformed and ctx.error is None:
            ctx.error = "upstream_malformed_events"  # forwarded without them; never cached
        apply_usage(ctx, tally.usage)
        if tally.done:
            self._response.release()
        else:
            self._response.close()  # drops the connection: the backend sees the cancel
        self._on_close(ctx.outcome == "upstream_error")


def apply_usage(ctx: RequestContext, usage: object) -> None:
    """Take the backend's own token counts when it reported them."""
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        ctx.prompt_tokens, ctx.completion_tokens, ctx.usage_source = prompt, completion, "backend"
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        ctx.cached_tokens = cached if isinstance(cached, int) else 0
