"""Structured logging, configured once: JSON lines, one per request plus operational events.

Lines are written in batches, off the request path: structlog flushes after every line, and
`BatchedStream` turns that flush into one real write and flush at most `delay_s` later (at once past
`max_bytes`), so a burst of requests costs one write syscall instead of one per line. Nothing is lost
on shutdown: closing the stream (the CLI does, however serving ends) and interpreter exit write what is
left; a process killed outright (SIGKILL) loses at most the last `delay_s` of lines.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
from typing import BinaryIO, Protocol

import orjson
import structlog

FLUSH_DELAY_S = 0.02
FLUSH_BYTES = 64 * 1024


class Sink(Protocol):
    def write(self, data: bytes) -> int: ...

    def flush(self) -> None: ...


class BatchedStream:
    """A write-behind buffer in front of `stream` (a file, stdout, a RotatingLogFile)."""

    def __init__(self, stream: Sink, delay_s: float = FLUSH_DELAY_S, max_bytes: int = FLUSH_BYTES) -> None:
        self._stream = stream
        self._delay_s = delay_s
        self._max_bytes = max_bytes
        self._pending = bytearray()
        self._timer: asyncio.TimerHandle | None = None
        atexit.register(self.drain)

    def write(self, data: bytes) -> int:
        self._pending += data
        if len(self._pending) >= self._max_bytes:
            self.drain()
        return len(data)

    def flush(self) -> None:
        """Called after every line: schedule the real flush (at once outside an event loop)."""
        if self._timer is not None or not self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.drain()
            return
        self._timer = loop.call_later(self._delay_s, self.drain)

    def drain(self) -> None:
        """Write and flush everything pending now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pending:
            data, self._pending = bytes(self._pending), bytearray()
            self._stream.write(data)
        self._stream.flush()

    def close(self) -> None:
        self.drain()
        atexit.unregister(self.drain)
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


def configure_logging(stream: BinaryIO | Sink | None = None, level: int = logging.INFO) -> BatchedStream:
    """Every logger renders one JSON object per line to `stream` (stdout by default), written in batches;
    close the returned stream when serving ends."""
    batched = BatchedStream(stream or sys.stdout.buffer)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        logger_factory=structlog.BytesLoggerFactory(batched),  # type: ignore[arg-type]  # write + flush
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,  # serving only: tests leave logging unconfigured for capture_logs
    )
    return batched
