"""SseRelay: streams an upstream SSE response to the client and reports what it said to a `StreamSink`.

The gateway writes the end of every stream it completes (`_ending`): the finish reason and the usage
chunk the backend left out (llama.cpp's server sends no usage, and now and then no finish reason),
then `[DONE]`. A stream that handed `[DONE]` to the client is complete (200, ok) whatever the socket
does next: clients close it as soon as they read `[DONE]`. A stream the client left is settled with
what was read from the backend, forwarded or not: those tokens were generated and are priced.
A stream that breaks off (reset, EOF before [DONE], idle) goes on from its `Resumer`'s continuation when
it gives one (issue 32: gateway.upstream.resume, gateway.upstream.continuation); otherwise it ends with an error event
saying why not.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import orjson

from gateway.backends.h1 import ClientFailure, Response
from gateway.backends.idle import IdleWatchdog
from gateway.sse import SseScanner, StreamTally


def error_event(message: str, code: str) -> bytes:
    """An SSE event carrying an OpenAI error object: how a stream that already started says it failed."""
    error = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How a relayed stream ended, besides its tally."""

    delivered: bool  # the client's write of the end ([DONE]) went through
    failed: bool  # the stream broke off, went idle or ended early
    capped: bool  # the tenant's output cap ended it (finish reason "length")
    added_finish: str | None  # the finish reason the gateway wrote for a backend that sent none


class StreamSink(Protocol):
    """Where a relay reports what its stream said (the proxy stage writes it into the request's context)."""

    def failed(self, code: str) -> None:
        """The stream broke off, went idle or ended early: the client got an error event with `code`."""

    def counted_usage(self, tally: StreamTally) -> dict[str, int]:
        """The usage to send a client that asked for it, when the backend sent none: the gateway's counts."""
        ...

    def closed(self, tally: StreamTally, end: StreamEnd) -> None:
        """The relay is done, and the upstream released or dropped."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """The next part of a broken stream: its upstream response, the first bytes read from it, the scanner
    that splices it, and where the relay reports its end."""

    response: Response
    first: bytes
    scanner: SseScanner
    sink: StreamSink


class Resumer(Protocol):
    """Continues one request's broken stream elsewhere (the proxy stage builds it per request)."""

    async def resume(self, scanner: SseScanner, code: str) -> Continuation | str | None:
        """The stream `scanner` read broke (`code`): its continuation; why there is none; or None when nothing
        was left to generate (every token asked for was sent, only the stream's end was lost)."""
        ...


class SseRelay:
    def __init__(
        self,
        response: Response,
        scanner: SseScanner,
        first: bytes,
        sink: StreamSink,
        watchdog: IdleWatchdog,
        idle_s: float,
        *,
        max_tokens: int | None,
        wants_usage: bool,
        resumer: Resumer | None = None,
    ) -> None:
        self._response = response
        self._scanner = scanner
        self._first = first
        self._sink = sink
        self._max_tokens = max_tokens
        self._wants_usage = wants_usage
        self._resumer = resumer
        self._closed = False
        self._idle = False
        self._failed = False
        self._capped = False
        self._added_finish: str | None = None
        self._delivered = False  # the client's write of the stream's end (with [DONE]) went through
        self._watchdog = watchdog
        self.idle_s = idle_s
        self.last_read = time.monotonic()
        response.read_timeout = None  # the watchdog keeps the idle timeout from here on
        watchdog.watch(self)

    async def chunks(self) -> AsyncIterator[bytes]:
        data = self._first
        while True:  # once per part: more than one only when a broken stream was resumed
            scanner = self._scanner
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
                    data = await self._response.readany()
                    self.last_read = time.monotonic()
                message, code = "the backend stream ended before [DONE]", "upstream_stream_truncated"
            except (ClientFailure, TimeoutError) as err:
                if self._idle:
                    message, code = f"the backend sent nothing for {self.idle_s:g} s", "upstream_idle_timeout"
                else:
                    message, code = f"the backend stream broke off: {type(err).__name__}", "upstream_stream_broken"
            nxt = await self._resumer.resume(scanner, code) if self._resumer is not None else ""
            if nxt is None:  # every token asked for was sent: only the stream's end was lost
                yield self._ending()
                self._delivered = True
                return
            if isinstance(nxt, str):
                yield self._fail(f"{message}; not resumed: {nxt}" if nxt else message, code)
                return
            data = self._switch(nxt)

    def _switch(self, part: Continuation) -> bytes:
        """Go on from a resumed stream's next part (the broken upstream dropped); its first bytes."""
        self._response.close()
        self._response, self._scanner, self._sink = part.response, part.scanner, part.sink
        part.response.read_timeout = None  # the watchdog keeps the idle timeout
        self._idle = False
        self.last_read = time.monotonic()
        self._watchdog.watch(self)  # again: a sweep that found the stream idle stopped watching it
        return part.first

    def abort_idle(self) -> None:
        """Called by the watchdog: the backend went quiet for too long; the read loop then fails."""
        self._idle = True
        self._response.close()

    def _ending(self) -> bytes:
        """The end of the client's stream: the finish reason (the output cap's `length`, or one the backend
        left out) and the usage chunk (asked for, and not sent by the backend) before [DONE]."""
        tally = self._scanner.tally
        reason = None
        if tally.capped:
            self._capped, reason = True, "length"
        elif tally.finish_reason is None:
            reached = self._max_tokens is not None and tally.content_chunks >= self._max_tokens
            reason = self._added_finish = "length" if reached else "stop"
        tally.finish_reason = reason or tally.finish_reason
        usage = self._sink.counted_usage(tally) if self._wants_usage and tally.usage is None else None
        return self._scanner.ending(reason, usage)

    async def _read_to_end(self) -> None:
        """After [DONE]: read the upstream to its end (nothing more is forwarded), so its connection is reused."""
        with contextlib.suppress(ClientFailure, TimeoutError):
            while await self._response.readany():
                self.last_read = time.monotonic()

    def _fail(self, message: str, code: str) -> bytes:
        self._failed = True
        self._sink.failed(code)
        return error_event(message, code)

    def _drain(self) -> None:
        """Tally what was read from the upstream but never forwarded (the client left): generated, so priced."""
        self._scanner.feed(self._response.read_nowait())

    def close(self) -> None:
        """Report what the stream said, and release (or abort) the upstream."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.forget(self)
        if not self._delivered:
            self._drain()
        if self._scanner.tally.done:
            self._response.release()
        else:
            self._response.close()  # drops the connection: the backend sees the cancel
        self._sink.closed(self._scanner.tally, StreamEnd(self._delivered, self._failed, self._capped, self._added_finish))
