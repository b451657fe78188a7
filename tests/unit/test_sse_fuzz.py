"""Property tests of the SSE forwarder: whatever the chunk boundaries (inside events, inside CRLF
pairs, inside UTF-8 characters), the bytes forwarded and the tally are those of the whole stream."""

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import OutputLimit, SseScanner

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)  # emoji, accents, CJK


@st.composite
def events(draw: st.DrawFn) -> tuple[bytes, bool]:
    """One SSE event (without its terminating blank line) and whether it is dropped (malformed data)."""
    kind = draw(st.sampled_from(["content", "content", "multiline", "comment", "finish", "usage", "malformed"]))
    if kind == "comment":
        return b": " + draw(TEXT).replace("\r", "").replace("\n", "").encode(), False
    if kind == "malformed":
        return b"data: {not json " + draw(TEXT).replace("\r", "").replace("\n", "").encode(), True
    chunk: dict = {"id": "c", "object": "chat.completion.chunk", "choices": []}
    if kind == "usage":
        chunk["usage"] = {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 99))}
    else:
        finish = "stop" if kind == "finish" else None
        chunk["choices"] = [{"index": 0, "delta": {"content": draw(TEXT)}, "finish_reason": finish}]
    if kind == "multiline":  # one data: line per line of indented JSON, joined back with \n
        lines = orjson.dumps(chunk, option=orjson.OPT_INDENT_2).split(b"\n")
        return b"\n".join(b"data: " + line for line in lines), False
    return b"data: " + orjson.dumps(chunk), False


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, bytes, list[int]]:
    """(the upstream's bytes, the bytes the client must get, cut points)."""
    drawn = draw(st.lists(events(), max_size=12))
    crlf = draw(st.booleans())
    done = draw(st.booleans())
    wire, expected = b"", b""
    for event, malformed in drawn + ([(b"data: [DONE]", True)] if done else []):
        wire += (event + b"\n\n").replace(b"\n", b"\r\n") if crlf else event + b"\n\n"
        expected += b"" if malformed else event + b"\n\n"  # CRLF comes out as LF; [DONE] is held back
    cuts = sorted(draw(st.lists(st.integers(0, len(wire)), max_size=20)))
    return wire, expected, cuts


def feed(wire: bytes, cuts: list[int], limit: OutputLimit | None = None) -> tuple[bytes, SseScanner]:
    scanner = SseScanner("chat", forward_usage=True, collect_text=True, limit=limit)
    bounds = [0, *cuts, len(wire)]
    out = b"".join(scanner.feed(wire[a:b]) for a, b in zip(bounds, bounds[1:]))
    return out, scanner


def tally(scanner: SseScanner) -> tuple:
    t = scanner.tally
    return (t.content_chunks, t.content_chars, t.finish_reason, t.usage, t.done, t.capped, t.malformed, t.text)


@settings(max_examples=300, deadline=None, database=None)
@given(streams())
def test_forwarded_bytes_and_tally_do_not_depend_on_chunking(stream: tuple[bytes, bytes, list[int]]) -> None:
    wire, expected, cuts = stream
    out, scanner = feed(wire, cuts)
    whole, reference = feed(wire, [])
    assert out == whole == expected
    assert tally(scanner) == tally(reference)
    assert scanner.pending == b""
    text = "".join(scanner.tally.text or [])
    assert scanner.tally.content_chars == len(text)


@settings(max_examples=200, deadline=None, database=None)
@given(streams(), st.integers(1, 5), st.integers(1, 30))
def test_an_output_cap_ends_at_the_same_place_whatever_the_chunking(stream: tuple[bytes, bytes, list[int]],
                                                                   tokens: int, chars: int) -> None:
    wire, _, cuts = stream
    limit = OutputLimit(tokens=tokens, chars=chars)
    out, scanner = feed(wire, cuts, limit)
    whole, reference = feed(wire, [], OutputLimit(tokens=tokens, chars=chars))
    assert out == whole
    assert tally(scanner) == tally(reference)
    assert scanner.tally.content_chunks <= tokens and scanner.tally.content_chars <= chars


def event_bounds(wire: bytes) -> list[int]:
    """The cut points between events: each read is one whole event (the scanner's fast path)."""
    sep = b"\r\n\r\n" if b"\r\n\r\n" in wire else b"\n\n"
    cuts, at = [], wire.find(sep)
    while at >= 0:
        cuts.append(at + len(sep))
        at = wire.find(sep, at + len(sep))
    return cuts


@settings(max_examples=300, deadline=None, database=None)
@given(streams(), st.integers(1, 5), st.integers(1, 30))
def test_one_event_per_read_forwards_and_tallies_as_the_whole_stream(stream: tuple[bytes, bytes, list[int]],
                                                                     tokens: int, chars: int) -> None:
    wire, expected, _ = stream
    out, scanner = feed(wire, event_bounds(wire))
    whole, reference = feed(wire, [])
    assert out == whole == expected and tally(scanner) == tally(reference)
    capped, capped_scanner = feed(wire, event_bounds(wire), OutputLimit(tokens=tokens, chars=chars))
    capped_whole, capped_reference = feed(wire, [], OutputLimit(tokens=tokens, chars=chars))
    assert capped == capped_whole and tally(capped_scanner) == tally(capped_reference)


@settings(max_examples=200, deadline=None, database=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300), max_size=10))
def test_arbitrary_bytes_never_raise(data: bytes, cuts: list[int]) -> None:
    out, scanner = feed(data, sorted(c for c in cuts if c <= len(data)))
    assert len(out) <= len(data)  # forwarded events are never longer than what came in (CRLF shrinks)
    assert scanner.tally.content_chunks >= 0
