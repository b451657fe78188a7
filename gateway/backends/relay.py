"""SseRelay: streams an upstream SSE response to the client and settles the request when done.

The gateway writes the end of every stream it completes (`_ending`): the finish reason and the usage
chunk the backend left out (llama.cpp's server sends no usage, and now and then no finish reason),
then `[DONE]`. A stream that handed `[DONE]` to the client is complete (200, ok) whatever the socket
does next: clients close it as soon as they read `[DONE]`. A stream the client left is settled with
what was read from the backend, forwarded or not: those tokens were generated and are priced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import orjson
import structlog

from gateway.backends.idle import IdleWatchdog
from gateway.context import RequestContext
from gateway.sse import SseScanner

log = structlog.get_logger("gateway.relay")


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
        count_tokens: Callable[[RequestContext], None],
    ) -> None:
        self._ctx = ctx
        self._response = response
        self._scanner = scanner
        self._first = first
        self._on_close = on_close
        self._count_tokens = count_tokens
        self._closed = False
        self._idle = False
        self._delivered = False  # the client's write of the stream's end (with [DONE]) went through
        self._watchdog = watchdog
        self.idle_s = idle_s
        self.last_read = time.monotonic()
        connection = response.connection
        if connection is not None and connection.protocol is not None:
            connection.protocol.read_timeout = None  # the watchdog keeps the idle timeout from here on
            connection.protocol.start_timeout()  # with no timeout set, this cancels the armed timer
        watchdog.watch(self)

    async def chunks(self) -> AsyncIterator[bytes]:
        scanner, data = self._scanner, self._first
        try:
            while data:
                out = scanner.feed(data)
                if scanner.tally.done or scanner.tally.capped:
                    yield out + self._ending()
                    self._delivered = True  # resumed: the edge wrote it
                    if scanner.tally.done:
                        await self._read_to_end()
                    return  # capped: `close` cancels the upstream
                if out:
                    yield out
                data = await self._response.content.readany()
                self.last_read = time.monotonic()
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            if self._idle:
                yield self._fail(f"the backend sent nothing for {self.idle_s:g} s", "upstream_idle_timeout")
            else:
                yield self._fail(f"the backend stream broke off: {type(err).__name__}", "upstream_stream_broken")
            return
        yield self._fail("the backend stream ended before [DONE]", "upstream_stream_truncated")

    def abort_idle(self) -> None:
        """Called by the watchdog: the backend went quiet for too long; the read loop then fails."""
        self._idle = True
        self._response.close()

    def _ending(self) -> bytes:
        """The end of the client's stream: the finish reason (the output cap's `length`, or one the backend
        left out) and the usage chunk (asked for, and not sent by the backend) before [DONE]."""
        tally, ctx = self._scanner.tally, self._ctx
        reason = None
        if tally.capped:
            ctx.output_capped, reason = True, "length"
        elif tally.finish_reason is None:
            reached = ctx.max_tokens is not None and tally.content_chunks >= ctx.max_tokens
            reason = "length" if reached else "stop"
            ctx.error = ctx.error or "upstream_missing_finish"
            log.warning("upstream_missing_finish", request_id=ctx.request_id,
                        backend=ctx.replica.name if ctx.replica else None, finish_reason=reason,
                        completion_chunks=tally.content_chunks, max_tokens=ctx.max_tokens)
        tally.finish_reason = reason or tally.finish_reason
        return self._scanner.ending(reason, self._counted_usage())

    def _counted_usage(self) -> dict[str, int] | None:
        """The usage the client asked for and the backend did not send: the gateway's counts, those it logs."""
        ctx = self._ctx
        if not ctx.client_wants_usage or self._scanner.tally.usage is not None:
            return None
        self._settle()
        self._count_tokens(ctx)
        prompt, completion = ctx.prompt_tokens or 0, ctx.completion_tokens or 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def _read_to_end(self) -> None:
        """After [DONE]: read the upstream to its end (nothing more is forwarded), so its connection is reused."""
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            while await self._response.content.readany():
                self.last_read = time.monotonic()

    def _fail(self, message: str, code: str) -> bytes:
        self._ctx.outcome = "upstream_error"
        self._ctx.error = code
        return error_event(message, code)

    def _drain(self) -> None:
        """Tally what was read from the upstream but never forwarded (the client left): generated, so priced."""
        try:
            self._scanner.feed(self._response.content.read_nowait())
        except (aiohttp.ClientError, asyncio.TimeoutError, RuntimeError):
            pass  # the stream had failed, or a read is in progress: nothing more to count

    def close(self) -> None:
        """Settle the context from what the stream said, and release (or abort) the upstream."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.forget(self)
        ctx = self._ctx
        if not self._delivered:
            self._drain()
        self._settle()
        if self._delivered and ctx.outcome == "client_disconnected":
            ctx.status, ctx.outcome = 200, "ok"  # the client had all of it, [DONE] included, then closed
        if self._scanner.tally.done:
            self._response.release()
        else:
            self._response.close()  # drops the connection: the backend sees the cancel
        self._on_close(ctx.outcome == "upstream_error")

    def _settle(self) -> None:
        """Write what the stream said into the context."""
        tally, ctx = self._scanner.tally, self._ctx
        ctx.first_token_at = tally.first_token_at
        ctx.finish_reason = tally.finish_reason
        ctx.output_chunks = tally.content_chunks
        if tally.text is not None:
            ctx.response_text = "".join(tally.text)
        if tally.malformed and ctx.error is None:
            ctx.error = "upstream_malformed_events"  # forwarded without them; never cached
        apply_usage(ctx, tally.usage)


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
