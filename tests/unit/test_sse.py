import orjson
import pytest

from gateway.sse import SseScanner


def chat_event(content: str | None = None, finish: str | None = None, usage: dict | None = None,
               choices: bool = True) -> bytes:
    obj: dict = {"object": "chat.completion.chunk"}
    obj["choices"] = [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + orjson.dumps(obj) + b"\n\n"


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
STREAM = (chat_event("Hel") + chat_event("lo") + chat_event("!", "stop")
          + chat_event(usage=USAGE, choices=False) + b"data: [DONE]\n\n")
STREAM_WITHOUT_USAGE = STREAM.replace(chat_event(usage=USAGE, choices=False), b"")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50, len(STREAM)])
def test_any_chunking_forwards_the_same_bytes_and_tally(size: int) -> None:
    scanner = SseScanner("chat", forward_usage=True)
    out = b"".join(scanner.feed(STREAM[i:i + size]) for i in range(0, len(STREAM), size))
    assert out + scanner.ending() == STREAM  # [DONE] is held back: the relay ends the stream
    assert scanner.tally.content_chunks == 3
    assert scanner.tally.finish_reason == "stop"
    assert scanner.tally.usage == USAGE
    assert scanner.tally.done
    assert scanner.pending == b""


def test_usage_only_event_is_dropped_unless_the_client_asked() -> None:
    scanner = SseScanner("chat", forward_usage=False)
    assert scanner.feed(STREAM) + scanner.ending() == STREAM_WITHOUT_USAGE
    assert scanner.tally.usage == USAGE


def test_incomplete_event_waits_for_the_rest() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    event = chat_event("x")
    assert scanner.feed(event[:-1]) == b""
    assert scanner.pending == event[:-1]
    assert scanner.feed(event[-1:]) == event


def test_crlf_events_are_normalised_and_tallied() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    crlf = chat_event("a").replace(b"\n", b"\r\n")
    assert scanner.feed(crlf) == chat_event("a")
    assert scanner.tally.content_chunks == 1


def test_comments_pass_and_malformed_data_is_dropped_and_counted() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b": keep-alive\n\n") == b": keep-alive\n\n"
    assert scanner.feed(b"data: {not json\n\n" + chat_event("ok")) == chat_event("ok")
    assert scanner.tally.malformed == 1


def test_multiline_data_is_joined() -> None:
    scanner = SseScanner("completions", forward_usage=True)
    event = b'data: {"choices": [{"text": "hi",\ndata:  "finish_reason": "length"}]}\n\n'
    assert scanner.feed(event) == event
    assert scanner.tally.content_chunks == 1
    assert scanner.tally.finish_reason == "length"


def test_completions_text_counts_and_first_token_time_is_set() -> None:
    scanner = SseScanner("completions", forward_usage=True)
    scanner.feed(b'data: {"choices": [{"text": ""}]}\n\n')
    assert scanner.tally.first_token_at is None
    scanner.feed(b'data: {"choices": [{"text": "a"}]}\n\n')
    assert scanner.tally.first_token_at is not None
    assert scanner.tally.content_chunks == 1


def test_a_token_limit_stops_forwarding_after_the_nth_content_chunk() -> None:
    from gateway.sse import OutputLimit

    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(tokens=2))
    out = scanner.feed(STREAM)
    assert out == chat_event("Hel") + chat_event("lo")
    assert scanner.tally.capped and scanner.tally.content_chunks == 2
    assert scanner.feed(chat_event("more")) == b""
    ending = scanner.ending("length")
    assert b'"finish_reason":"length"' in ending and ending.endswith(b"data: [DONE]\n\n")


def test_a_char_limit_trims_the_chunk_that_crosses_it() -> None:
    from gateway.sse import OutputLimit

    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(chars=4))
    out = scanner.feed(STREAM)
    texts = [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in out.split(b"\n\n") if e]
    assert texts == ["Hel", "l"] and scanner.tally.capped and scanner.tally.content_chars == 4


def test_nothing_is_forwarded_from_done_on() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(chat_event("a") + b"data: [DONE]\n\n" + chat_event("late")) == chat_event("a")
    assert scanner.tally.done and scanner.tally.content_chunks == 1


def test_the_ending_supplies_a_finish_chunk_and_usage_before_done() -> None:
    scanner = SseScanner("completions", forward_usage=True)
    scanner.feed(b'data: {"id": "c9", "object": "text_completion", "choices": [{"text": "hi"}]}\n\n')
    usage = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    finish, counted, done = scanner.ending("stop", usage).split(b"\n\n")[:3]
    assert orjson.loads(finish[6:]) == {"id": "c9", "object": "text_completion",
                                        "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
    assert orjson.loads(counted[6:]) == {"id": "c9", "object": "text_completion", "choices": [], "usage": usage}
    assert done == b"data: [DONE]"
