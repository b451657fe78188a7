"""Incremental reader of an upstream OpenAI SSE stream: forwards events byte for byte and tallies them.

`SseScanner.feed` takes whatever bytes arrived and returns the bytes to send on: every complete
event, untouched, in one piece (an incomplete tail waits for the next read). It drops the
usage-only event when the client did not ask for usage, data that is not JSON, and everything
after an output cap is reached (the chunk that crosses a character cap is trimmed to fit). It holds
back `[DONE]` and what follows: `ending` writes the stream's last events, and the relay decides
what they carry.

The output cap holds for every output (issue 37): a request with several (`n`, a list of prompts:
`outputs` > 1) is counted and cut per choice `index`. The chunk that takes a choice to its cap says
finish_reason "length" for it; that choice's later content and finish are dropped (tallied as work
the backend did, not forwarded), the other choices go on, and the stream ends as the backend ends it
(capped, upstream cancelled, only once every output is). One output keeps the single-answer path:
the cap ends the stream and `ending` writes the "length" finish.

Every data event is parsed (orjson: ~1 µs for a chunk; a regex pre-check measured slower).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.types import Endpoint

DONE = b"[DONE]"


@dataclass(slots=True)
class OutputLimit:
    tokens: int | None = None  # content chunks (one token each on llama.cpp and vLLM)
    chars: int | None = None


@dataclass(slots=True)
class StreamTally:
    """What the stream told us so far."""

    content_chunks: int = 0
    content_chars: int = 0
    first_token_at: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False
    capped: bool = False  # the output limit was reached: nothing more is forwarded
    malformed: int = 0
    head: dict[str, Any] = field(default_factory=dict)  # id, object, created, model of the chunks
    text: list[str] | None = None  # the content pieces, when collecting (for the response cache)
    cut: int = 0  # outputs the cap cut (several outputs: each ended with "length"; one: `capped`)


@dataclass(slots=True)
class _Choice:
    """One output's count under the cap (several outputs only)."""

    chunks: int = 0
    chars: int = 0
    done: bool = False  # reached its cap: its later events are dropped


class SseScanner:
    def __init__(self, endpoint: Endpoint, *, forward_usage: bool, collect_text: bool = False,
                 limit: OutputLimit | None = None, outputs: int = 1) -> None:
        self.tally = StreamTally(text=[] if collect_text else None)
        self._chat = endpoint == "chat"
        self._forward_usage = forward_usage
        self._limit = limit
        self._pending = b""
        self._outputs = outputs
        # several outputs under a cap: each counted and cut by its index (None: the single-answer path)
        self._choices: dict[int, _Choice] | None = {} if limit is not None and outputs > 1 else None

    @property
    def endpoint(self) -> Endpoint:
        """What the stream answers (a continuation reads its events as more of the same)."""
        return "chat" if self._chat else "completions"

    @property
    def forward_usage(self) -> bool:
        return self._forward_usage

    @property
    def limit(self) -> OutputLimit | None:
        return self._limit

    def feed(self, data: bytes) -> bytes:
        if not self._pending and data.startswith(b"data: ") and data.find(b"\n") == len(data) - 2 \
                and data.endswith(b"\n\n") and data[-3:-2] != b"\r":  # one whole event, as most reads are
            if self.tally.capped or self.tally.done:
                return b""
            raw = data[:-2]
            out = self._inspect(raw)
            return data if out is raw else b"" if out is None else out + b"\n\n"
        buf = self._pending + data if self._pending else data
        end = complete_prefix_end(buf)
        if end == 0:
            self._pending = buf
            return b""
        complete, self._pending = buf[:end], buf[end:]
        crlf = b"\r" in complete
        events = (complete.replace(b"\r\n", b"\n") if crlf else complete).split(b"\n\n")
        kept: list[bytes] = []
        changed = crlf
        for raw in events:
            if not raw:
                continue
            out = None if self.tally.capped or self.tally.done else self._inspect(raw)
            if out is not None:
                kept.append(out)
            changed = changed or out is not raw
        if not changed:
            return complete
        return b"".join(event + b"\n\n" for event in kept)

    @property
    def pending(self) -> bytes:
        """Bytes of an event that never completed (a truncated stream)."""
        return self._pending

    def _inspect(self, raw: bytes) -> bytes | None:
        """Tally one event: the bytes to forward for it (itself, or a trimmed copy), or None to drop it."""
        payload = data_of(raw)
        if payload is None:
            return raw  # comment or non-data field: forwarded as is
        if payload == DONE:
            self.tally.done = True
            return None  # the relay ends the stream: see `ending`
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            self.tally.malformed += 1
            return None
        return self._tally_chunk(chunk, raw)

    def _tally_chunk(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        """Tally one parsed chat chunk (a subclass reads another protocol's events)."""
        choices = chunk.get("choices")
        if not self.tally.head:
            self.tally.head = {k: chunk[k] for k in ("id", "object", "created", "model") if k in chunk}
        usage = chunk.get("usage")
        if usage:
            self.tally.usage = usage
        if not choices:
            return raw if self._forward_usage or not usage else None
        if self._choices is not None:
            return self._tally_choices(self._choices, choices, chunk, raw)
        choice = choices[0]
        return self._tally_choice(choice, chunk, raw) if isinstance(choice, dict) else raw

    def _tally_choice(self, choice: dict[str, Any], chunk: dict[str, Any], raw: bytes) -> bytes:
        delta = choice.get("delta") if self._chat else None
        content = (delta.get("content") if isinstance(delta, dict) else None) if self._chat else choice.get("text")
        tally = self.tally
        reason = choice.get("finish_reason")
        if reason:
            tally.finish_reason = reason
        if not content or not isinstance(content, str):
            return raw
        limit = self._limit
        if limit is not None and limit.chars is not None and tally.content_chars + len(content) > limit.chars:
            content = content[: limit.chars - tally.content_chars]
            raw = self._rewrite(chunk, choice, content)
        tally.content_chunks += 1
        tally.content_chars += len(content)
        if limit is not None and limit.chars is not None and tally.content_chars >= limit.chars:
            tally.capped = True
        if tally.first_token_at is None:
            tally.first_token_at = time.perf_counter()
        if tally.text is not None:
            tally.text.append(content)
        if limit is not None and limit.tokens is not None and tally.content_chunks >= limit.tokens:
            tally.capped = True
        return raw

    def _tally_choices(self, states: dict[int, _Choice], choices: list[Any], chunk: dict[str, Any],
                       raw: bytes) -> bytes | None:
        """Tally a chunk of a request with several outputs under a cap, each choice by its index: the chunk
        as it came, a copy with choices cut or dropped, or None when nothing of it is left to forward."""
        kept: list[Any] = []
        changed = False
        for choice in choices:
            out = self._cap_choice(states, choice) if isinstance(choice, dict) else choice
            changed = changed or out is not choice
            if out is not None:
                kept.append(out)
        if not changed:
            return raw
        if not kept and not (self._forward_usage and chunk.get("usage")):
            return None
        return b"data: " + orjson.dumps({**chunk, "choices": kept})

    def _cap_choice(self, states: dict[int, _Choice], choice: dict[str, Any]) -> dict[str, Any] | None:
        """One choice under the cap: itself, a copy cut to the cap (finish_reason "length"), or None (past it)."""
        index = choice.get("index")
        key = index if isinstance(index, int) else 0
        state = states.get(key)
        if state is None:
            state = states[key] = _Choice()
        delta = choice.get("delta") if self._chat else None
        content = (delta.get("content") if isinstance(delta, dict) else None) if self._chat else choice.get("text")
        tally = self.tally
        if not isinstance(content, str):
            content = None
        if state.done:  # generated (priced when counted), never forwarded
            if content:
                tally.content_chunks += 1
            return None
        reason = choice.get("finish_reason")
        if reason:
            tally.finish_reason = reason
        if not content:
            return choice
        limit = self._limit or OutputLimit()
        cut = limit.chars is not None and state.chars + len(content) > limit.chars
        if limit.chars is not None and cut:
            content = content[: limit.chars - state.chars]
        state.chunks += 1
        state.chars += len(content)
        tally.content_chunks += 1
        tally.content_chars += len(content)
        if tally.first_token_at is None:
            tally.first_token_at = time.perf_counter()
        if tally.text is not None:
            tally.text.append(content)
        if not cut and not (limit.chars is not None and state.chars >= limit.chars) \
                and not (limit.tokens is not None and state.chunks >= limit.tokens):
            return choice
        state.done = True
        tally.cut += 1
        if tally.cut >= self._outputs:
            tally.capped = True  # every output is at its cap: the relay ends the stream
        ended = {**choice, "finish_reason": "length" if cut or not reason else reason}
        if cut:
            if self._chat:
                ended["delta"] = {**choice["delta"], "content": content}
            else:
                ended["text"] = content
        return ended

    def _rewrite(self, chunk: dict[str, Any], choice: dict[str, Any], content: str) -> bytes:
        if self._chat:
            choice["delta"] = {**choice["delta"], "content": content}
        else:
            choice["text"] = content
        return b"data: " + orjson.dumps(chunk)

    def ending(self, reason: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        """The stream's last events: a finish chunk when `reason` is given, a usage chunk (empty choices)
        when `usage` is, then [DONE]."""
        events: list[dict[str, Any]] = []
        head = self.tally.head
        if reason is not None and not (self._choices is not None and self.tally.capped):  # each said "length"
            choice: dict[str, Any] = {"index": 0, "delta": {}} if self._chat else {"index": 0, "text": ""}
            events.append({**head, "choices": [{**choice, "finish_reason": reason}]})
        if usage is not None:
            events.append({**head, "choices": [], "usage": usage})
        return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n"


def complete_prefix_end(buf: bytes) -> int:
    """Length of the prefix of `buf` made of complete events."""
    lf = buf.rfind(b"\n\n")
    crlf = buf.rfind(b"\r\n\r\n")
    return max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)


def data_of(raw: bytes) -> bytes | None:
    """The joined `data:` field of one event (None when it has none)."""
    if raw.startswith(b"data: ") and b"\n" not in raw:
        return raw[6:]
    values = [
        line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(values) if values else None
