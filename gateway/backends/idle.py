"""One watchdog for every upstream stream's idle timeout.

A timer per read (`h1.Response.read_timeout`) would be a cancel and a heap push per token. After the
first byte the relay switches it off, and this task, waking once a second, closes the streams that
have sent nothing for their `read_timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Watched(Protocol):
    last_read: float
    idle_s: float

    def abort_idle(self) -> None: ...


class IdleWatchdog:
    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self._streams: set[Watched] = set()

    def watch(self, stream: Watched) -> None:
        self._streams.add(stream)

    def forget(self, stream: Watched) -> None:
        self._streams.discard(stream)

    def sweep(self) -> None:
        now = time.monotonic()
        for stream in [s for s in self._streams if now - s.last_read > s.idle_s]:
            self._streams.discard(stream)
            stream.abort_idle()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sweep()
