"""Structured logging, configured once: JSON lines, one per request plus operational events.

Lines are written in batches, off the request path: structlog flushes after every line, and
`BatchedStream` turns that flush into one real write and flush at most `delay_s` later (at once past
`max_bytes`), so a burst of requests costs one write syscall instead of one per line. Nothing is lost
on shutdown: closing the stream (the CLI does, however serving ends) and interpreter exit write what is
left; a process killed outright (SIGKILL) loses at most the last `delay_s` of lines.

The request line, one per request, skips structlog's processor chain (`log_request`): the chain's own
renderer renders it and a BytesLogger on the same stream (and lock) writes it, so its bytes are the ones
structlog would write.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol, cast

import orjson
import structlog
from structlog.typing import Processor

MAX_FIELD_CHARS = 256  # a string a client (or a backend) chose, as a log line keeps it: `bounded`
FLUSH_DELAY_S = 0.02
FLUSH_BYTES = 64 * 1024
RENDER = structlog.processors.JSONRenderer(serializer=orjson.dumps)


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


@dataclass(frozen=True, slots=True)
class _Direct:
    """How `configure_logging` set structlog up, for `log_request`."""

    chain: list[Processor]  # the list given to structlog (capture_logs swaps its contents in place)
    configured: list[Processor]  # what it held
    logger: structlog.BytesLogger
    info: bool  # the level filter lets INFO through

    def current(self) -> bool:
        """structlog still runs this chain, unchanged."""
        return structlog.get_config()["processors"] is self.chain and self.chain == self.configured


_direct: _Direct | None = None


def configure_logging(stream: BinaryIO | Sink | None = None, level: int = logging.INFO) -> BatchedStream:
    """Every logger renders one JSON object per line to `stream` (stdout by default), written in batches;
    close the returned stream when serving ends."""
    global _direct
    batched = BatchedStream(stream or sys.stdout.buffer)
    chain: list[Processor] = [structlog.processors.add_log_level, structlog.processors.format_exc_info, RENDER]
    structlog.configure(
        processors=chain,
        logger_factory=structlog.BytesLoggerFactory(batched),  # type: ignore[arg-type]  # write + flush
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,  # serving only: tests leave logging unconfigured for capture_logs
    )
    logger = structlog.BytesLogger(batched)  # type: ignore[arg-type]  # shares the factory's loggers' lock
    _direct = _Direct(chain, list(chain), logger, level <= logging.INFO)
    return batched


def bounded(value: str | None, limit: int = MAX_FIELD_CHARS) -> str | None:
    """`value` cut to `limit` characters, with a marker saying how long it was: every string a client chose
    (the model it asked for, ids, names) goes through here before a log line (a 3 MB `model` made a 3 MB line)."""
    if value is None or len(value) <= limit:
        return value
    return f"{value[:limit]}...[cut: {len(value)} chars]"


def log_request(fields: dict[str, Any]) -> None:
    """Log the request line: the bytes `log.info("request", **fields)` writes, keys in the same order.

    While structlog runs the chain `configure_logging` set, the line skips it: for these fields (no exc_info)
    the chain only appends the event and the level before rendering. Otherwise (logging unconfigured, tests
    capturing logs) it goes through structlog. Takes `fields` over."""
    direct = _direct
    if direct is None or not direct.current():
        structlog.get_logger("gateway.requests").info("request", **fields)
    elif direct.info:
        fields["event"] = "request"
        fields["level"] = "info"
        direct.logger.msg(cast(bytes, RENDER(direct.logger, "info", fields)))
