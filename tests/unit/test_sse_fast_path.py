"""The scanner's regex fast path tallies exactly what a full parse of every event would."""

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import OutputLimit, SseScanner

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


def event(obj: dict, spaced: bool) -> bytes:
    body = orjson.dumps(obj)
    if spaced:  # llama-cpp-python writes JSON with spaces after separators
        body = body.replace(b'":', b'": ').replace(b',"', b', "')
    return b"data: " + body + b"\n\n"


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    spaced = draw(st.booleans())
    chat = draw(st.booleans())
    events = []
    for text in draw(st.lists(TEXT, max_size=12)):
        delta = {"content": text} if chat else None
        choice = {"index": 0, "delta": delta, "finish_reason": None} if chat else {"index": 0, "text": text,
                                                                                   "finish_reason": None}
        extra = {"usage": None} if draw(st.booleans()) else {}
        events.append(event({"id": "x", "object": "chunk", "choices": [choice], **extra}, spaced))
        if draw(st.integers(0, 9)) == 0:
            events.append(b'data: {"id": <<garbage>>\n\n')
    final = {"index": 0, "delta": {}, "finish_reason": "stop"} if chat else {"index": 0, "text": "",
                                                                           "finish_reason": "stop"}
    events.append(event({"id": "x", "choices": [final]}, spaced))
    events.append(event({"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, spaced))
    return (b"c" if chat else b"t") + b"".join(events) + b"data: [DONE]\n\n"


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(1, 64))
def test_fast_and_full_tallies_agree(stream: bytes, piece: int) -> None:
    endpoint = "chat" if stream[:1] == b"c" else "completions"
    data = stream[1:]
    fast = SseScanner(endpoint, forward_usage=False)
    full = SseScanner(endpoint, forward_usage=False, limit=OutputLimit())  # a limit forces every parse
    out_fast = b"".join(fast.feed(data[i:i + piece]) for i in range(0, len(data), piece))
    out_full = b"".join(full.feed(data[i:i + piece]) for i in range(0, len(data), piece))
    a, b = fast.tally, full.tally
    assert (a.content_chunks, a.finish_reason, a.usage, a.done) == (b.content_chunks, b.finish_reason, b.usage, b.done)
    assert a.malformed == b.malformed
    assert out_fast == out_full
