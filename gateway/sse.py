"""Incremental reader of an upstream OpenAI SSE stream: forwards events byte for byte and tallies them.

`SseScanner.feed` takes whatever bytes arrived and returns the bytes to send on: every complete
event, untouched, in one piece (an incomplete tail waits for the next read). It drops only the
usage-only event when the client did not ask for usage, and data that is not JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.types import Endpoint

DONE = b"[DONE]"


@dataclass(slots=True)
class StreamTally:
    """What the stream told us so far."""

    content_chunks: int = 0
    first_token_at: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False
    malformed: int = 0
    text: list[str] | None = None  # the content pieces, when collecting (for the response cache)


class SseScanner:
    def __init__(self, endpoint: Endpoint, *, forward_usage: bool, collect_text: bool = False) -> None:
        self.tally = StreamTally(text=[] if collect_text else None)
        self._content_key = "delta" if endpoint == "chat" else None
        self._forward_usage = forward_usage
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data if self._pending else data
        end = _complete_prefix_end(buf)
        if end == 0:
            self._pending = buf
            return b""
        complete, self._pending = buf[:end], buf[end:]
        crlf = b"\r" in complete
        events = (complete.replace(b"\r\n", b"\n") if crlf else complete).split(b"\n\n")
        kept: list[bytes] = []
        dropped = False
        for raw in events:
            if not raw:
                continue
            if self._inspect(raw):
                kept.append(raw)
            else:
                dropped = True
        if not dropped and not crlf:
            return complete
        return b"".join(event + b"\n\n" for event in kept)

    @property
    def pending(self) -> bytes:
        """Bytes of an event that never completed (a truncated stream)."""
        return self._pending

    def _inspect(self, raw: bytes) -> bool:
        """Tally one event; False when it must not be forwarded."""
        payload = _data_of(raw)
        if payload is None:
            return True  # comment or non-data field: forwarded as is
        if payload == DONE:
            self.tally.done = True
            return True
        try:
            chunk = orjson.loads(payload)
            choices = chunk.get("choices")
        except (orjson.JSONDecodeError, AttributeError):
            self.tally.malformed += 1
            return False
        usage = chunk.get("usage")
        if usage:
            self.tally.usage = usage
        if not choices:
            return self._forward_usage or not usage
        self._tally_choice(choices[0])
        return True

    def _tally_choice(self, choice: Any) -> None:
        if not isinstance(choice, dict):
            return
        if self._content_key is None:
            content = choice.get("text")
        else:
            delta = choice.get(self._content_key)
            content = delta.get("content") if isinstance(delta, dict) else None
        tally = self.tally
        if content:
            tally.content_chunks += 1
            if tally.text is not None and isinstance(content, str):
                tally.text.append(content)
            if tally.first_token_at is None:
                tally.first_token_at = time.perf_counter()
        reason = choice.get("finish_reason")
        if reason:
            tally.finish_reason = reason


def _complete_prefix_end(buf: bytes) -> int:
    """Length of the prefix of `buf` made of complete events."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def _data_of(raw: bytes) -> bytes | None:
    """The joined `data:` field of one event (None when it has none)."""
    if raw.startswith(b"data: ") and b"\n" not in raw:
        return raw[6:]
    values = [
        line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(values) if values else None
