"""The SSE scanner and the output caps (gateway/sse.py), pinned exactly for the output-caps target's mutants
(issue 42): what `feed` forwards byte for byte on each of its paths, the tally, the single-output cap, the cap per
choice of a request with several outputs, `ending`'s bytes and `complete_prefix_end`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.sse import OutputLimit, SseScanner, complete_prefix_end, data_of

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
CHEAD = {"id": "t1", "object": "text_completion", "created": 1, "model": "m"}


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def chat(content: str | None, index: int = 0, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {**HEAD, "choices": [{"index": index, "delta": delta, "finish_reason": finish}], **extra}


def text(content: str, index: int = 0, finish: str | None = None) -> dict[str, Any]:
    return {**CHEAD, "choices": [{"index": index, "text": content, "finish_reason": finish}]}


def choices(*pairs: tuple[int, str | None], finish: str | None = None) -> dict[str, Any]:
    return {**HEAD, "choices": [{"index": i, "delta": {} if c is None else {"content": c}, "finish_reason": finish}
                                for i, c in pairs]}


def parsed(out: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e]


# -- complete_prefix_end, data_of ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("buf", "end"), [
    (b"", 0), (b"data: a", 0), (b"data: a\n\n", 9), (b"data: a\n\ndata: b", 9), (b"\n\n", 2),
    (b"data: a\r\n\r\n", 11), (b"\r\n\r\n", 4), (b"data: a\n\ndata: b\r\n\r\n", 20), (b"data: a\r\n\r\ndata: b\n\n", 20),
    (b"data: a\r\n\r\nxx", 11),
])
def test_complete_prefix_end(buf: bytes, end: int) -> None:
    assert complete_prefix_end(buf) == end


@pytest.mark.parametrize(("raw", "data"), [
    (b"data: x", b"x"), (b"data:x", b"x"), (b": comment", None), (b"event: e\ndata: a\ndata:  b", b"a\n b"),
    (b"id: 1", None),
])
def test_data_of(raw: bytes, data: bytes | None) -> None:
    assert data_of(raw) == data


# -- __init__ and the tally --------------------------------------------------------------------------------------------

def test_a_new_scanner() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.tally.text is None and scanner.tally.content_chunks == 0 and scanner.pending == b""
    assert scanner.endpoint == "chat" and scanner.forward_usage is True and scanner.limit is None
    collecting = SseScanner("completions", forward_usage=False, collect_text=True, limit=OutputLimit(tokens=3))
    assert collecting.tally.text == [] and collecting.endpoint == "completions"
    assert collecting.forward_usage is False and collecting.limit == OutputLimit(tokens=3, chars=None)


def test_the_tally_of_a_chat_stream() -> None:
    scanner = SseScanner("chat", forward_usage=True, collect_text=True)
    data = event(chat("ab")) + event({**chat("cde"), "id": "other"}) + event(chat(None, finish="stop"))
    assert scanner.feed(data) == data
    tally = scanner.tally
    assert (tally.content_chunks, tally.content_chars, tally.finish_reason, tally.text) == (2, 5, "stop", ["ab", "cde"])
    assert tally.head == HEAD and tally.first_token_at is not None
    assert not tally.capped and not tally.done and tally.malformed == 0


def test_the_tally_of_a_completions_stream() -> None:
    scanner = SseScanner("completions", forward_usage=False, collect_text=True)
    data = event(text("ab")) + event(text("", finish="length"))
    assert scanner.feed(data) == data
    assert (scanner.tally.content_chunks, scanner.tally.content_chars, scanner.tally.finish_reason) == (1, 2, "length")
    assert scanner.tally.text == ["ab"] and scanner.tally.head == CHEAD


def test_the_first_token_time_is_the_first_contents() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    scanner.feed(event(chat("")))
    assert scanner.tally.first_token_at is None
    scanner.feed(event(chat("a")))
    first = scanner.tally.first_token_at
    scanner.feed(event(chat("b")))
    assert first is not None and scanner.tally.first_token_at == first


def test_content_that_is_no_string_is_not_counted() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    data = event({**HEAD, "choices": [{"index": 0, "delta": {"content": 5}}]})
    assert scanner.feed(data) == data and scanner.tally.content_chunks == 0


def test_a_choice_that_is_no_object_is_forwarded_uncounted() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    data = event({**HEAD, "choices": ["x"]})
    assert scanner.feed(data) == data and scanner.tally.content_chunks == 0


@pytest.mark.parametrize(("forward", "kept"), [(True, True), (False, False)])
def test_a_usage_chunk_is_forwarded_only_when_asked(forward: bool, kept: bool) -> None:
    scanner = SseScanner("chat", forward_usage=forward)
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    data = event({**HEAD, "choices": [], "usage": usage})
    assert scanner.feed(data) == (data if kept else b"")
    assert scanner.tally.usage == usage


def test_a_chunk_with_choices_and_usage_is_forwarded_either_way() -> None:
    scanner = SseScanner("chat", forward_usage=False)
    data = event({**chat("a"), "usage": {"prompt_tokens": 1}})
    assert scanner.feed(data) == data and scanner.tally.usage == {"prompt_tokens": 1}


def test_a_chunk_without_choices_or_usage_is_forwarded() -> None:
    scanner = SseScanner("chat", forward_usage=False)
    data = event({**HEAD, "choices": []})
    assert scanner.feed(data) == data


# -- feed's paths ---------------------------------------------------------------------------------------------------

def test_done_is_held_back_and_nothing_after_it_goes_on() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b"data: [DONE]\n\n") == b"" and scanner.tally.done
    assert scanner.feed(event(chat("late"))) == b""
    assert scanner.feed(event(chat("a")) + event(chat("b"))) == b""
    assert scanner.tally.content_chunks == 0


def test_done_in_a_read_of_several_events() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(event(chat("a")) + b"data: [DONE]\n\n" + event(chat("b"))) == event(chat("a"))
    assert scanner.tally.content_chunks == 1 and scanner.tally.done


def test_malformed_events_are_dropped_and_counted() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b"data: {nope\n\n") == b""
    assert scanner.feed(b"data: [1, 2]\n\n") == b""
    assert scanner.feed(b"data: {nope\n\n" + event(chat("a"))) == event(chat("a"))
    assert scanner.tally.malformed == 3


def test_comments_pass_as_they_are() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b": keep-alive\n\n") == b": keep-alive\n\n"
    assert scanner.feed(b": keep-alive\n\n" + event(chat("a"))) == b": keep-alive\n\n" + event(chat("a"))


def test_a_split_event_waits_for_its_end() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    data = event(chat("hello"))
    assert scanner.feed(data[:7]) == b"" and scanner.pending == data[:7]
    assert scanner.feed(data[7:-1]) == b"" and scanner.pending == data[:-1]
    assert scanner.feed(data[-1:]) == data and scanner.pending == b""
    assert scanner.tally.content_chunks == 1


def test_a_tail_waits_after_the_complete_events() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    first, second = event(chat("a")), event(chat("b"))
    assert scanner.feed(first + second[:5]) == first and scanner.pending == second[:5]
    assert scanner.feed(second[5:]) == second


def test_crlf_events_are_forwarded_with_lf() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    raw = b"data: " + orjson.dumps(chat("a"))
    assert scanner.feed(raw + b"\r\n\r\n") == raw + b"\n\n"
    assert scanner.tally.content_chunks == 1


def test_an_event_with_a_cr_before_its_end_takes_the_general_path() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    raw = b"data: " + orjson.dumps(chat("a"))
    assert scanner.feed(raw + b"\r\n\n") == raw + b"\n\n"  # its line ends made LF on the general path
    assert scanner.pending == b"" and scanner.tally.content_chunks == 1


def test_a_multiline_event_is_forwarded_whole() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    data = b"event: message\ndata: " + orjson.dumps(chat("a")) + b"\n\n"
    assert scanner.feed(data) == data and scanner.tally.content_chunks == 1


def test_an_empty_read() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b"") == b"" and scanner.pending == b""


# -- one output's cap ----------------------------------------------------------------------------------------------

def test_a_char_cap_trims_the_chunk_that_crosses_it_and_ends_the_stream() -> None:
    scanner = SseScanner("chat", forward_usage=True, collect_text=True, limit=OutputLimit(chars=5))
    assert scanner.feed(event(chat("abc"))) == event(chat("abc"))
    out = scanner.feed(event(chat("defg")))
    assert parsed(out) == [chat("de")]
    assert scanner.tally.capped and scanner.tally.content_chars == 5 and scanner.tally.text == ["abc", "de"]
    assert scanner.feed(event(chat("h"))) == b""


def test_a_char_cap_reached_exactly_ends_the_stream() -> None:
    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(chars=3))
    assert scanner.feed(event(chat("abc"))) == event(chat("abc"))
    assert scanner.tally.capped and scanner.tally.content_chunks == 1


def test_a_char_cap_trims_completion_text() -> None:
    scanner = SseScanner("completions", forward_usage=True, limit=OutputLimit(chars=2))
    assert parsed(scanner.feed(event(text("abcd")))) == [text("ab")]
    assert scanner.tally.capped and scanner.tally.content_chars == 2


def test_a_token_cap_counts_content_chunks() -> None:
    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(tokens=2))
    assert scanner.feed(event(chat("a"))) == event(chat("a")) and not scanner.tally.capped
    assert scanner.feed(event(chat(""))) == event(chat("")) and not scanner.tally.capped
    assert scanner.feed(event(chat("b"))) == event(chat("b")) and scanner.tally.capped
    assert scanner.feed(event(chat("c"))) == b""
    assert scanner.tally.content_chunks == 2


def test_under_the_cap_nothing_is_capped() -> None:
    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(tokens=5, chars=10))
    assert scanner.feed(event(chat("abcd"))) == event(chat("abcd"))
    assert not scanner.tally.capped


# -- several outputs' caps -----------------------------------------------------------------------------------------

def several(limit: OutputLimit, outputs: int = 2, endpoint: str = "chat", forward_usage: bool = True) -> SseScanner:
    return SseScanner(endpoint, forward_usage=forward_usage, collect_text=True, limit=limit,  # type: ignore[arg-type]
                      outputs=outputs)


def test_several_outputs_without_a_cap_take_the_single_path() -> None:
    scanner = SseScanner("chat", forward_usage=True, outputs=3)
    data = event(choices((0, "a"), (1, "b")))
    assert scanner.feed(data) == data and scanner.tally.content_chunks == 1  # the first choice only


def test_one_output_under_a_cap_takes_the_single_path() -> None:
    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(tokens=1), outputs=1)
    assert scanner.feed(event(chat("a"))) == event(chat("a")) and scanner.tally.capped


def test_each_choice_is_cut_at_its_own_token_cap() -> None:
    scanner = several(OutputLimit(tokens=2))
    assert scanner.feed(event(choices((0, "a"), (1, "b")))) == event(choices((0, "a"), (1, "b")))
    out = parsed(scanner.feed(event(choices((0, "c")))))
    assert out == [{**HEAD, "choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "length"}]}]
    assert scanner.tally.cut == 1 and not scanner.tally.capped
    # choice 0 is done: its content is counted (the backend made it) but dropped; choice 1 goes on
    out = parsed(scanner.feed(event(choices((0, "x"), (1, "d")))))
    assert out == [{**HEAD, "choices": [{"index": 1, "delta": {"content": "d"}, "finish_reason": "length"}]}]
    assert scanner.tally.cut == 2 and scanner.tally.capped
    assert scanner.tally.content_chunks == 5 and scanner.tally.content_chars == 4
    assert scanner.tally.text == ["a", "b", "c", "d"]


def test_a_choice_cut_by_characters_says_length_with_its_trimmed_content() -> None:
    scanner = several(OutputLimit(chars=3))
    out = parsed(scanner.feed(event(choices((0, "abcd"), (1, "xy")))))
    assert out == [{**HEAD, "choices": [{"index": 0, "delta": {"content": "abc"}, "finish_reason": "length"},
                                        {"index": 1, "delta": {"content": "xy"}, "finish_reason": None}]}]
    assert scanner.tally.content_chars == 5 and scanner.tally.cut == 1


def test_a_completion_choice_cut_by_characters() -> None:
    scanner = several(OutputLimit(chars=2), endpoint="completions")
    chunk = {**CHEAD, "choices": [{"index": 0, "text": "abc", "finish_reason": None},
                                  {"index": 1, "text": "z", "finish_reason": None}]}
    out = parsed(scanner.feed(event(chunk)))
    assert out == [{**CHEAD, "choices": [{"index": 0, "text": "ab", "finish_reason": "length"},
                                         {"index": 1, "text": "z", "finish_reason": None}]}]


def test_a_choice_reaching_its_char_cap_exactly_says_length() -> None:
    scanner = several(OutputLimit(chars=2))
    out = parsed(scanner.feed(event(choices((1, "ab")))))
    assert out == [{**HEAD, "choices": [{"index": 1, "delta": {"content": "ab"}, "finish_reason": "length"}]}]


def test_a_choice_ending_on_its_own_at_the_cap_keeps_its_reason() -> None:
    scanner = several(OutputLimit(tokens=1))
    out = parsed(scanner.feed(event(choices((0, "a"), finish="stop"))))
    assert out[0]["choices"][0]["finish_reason"] == "stop"
    assert scanner.tally.finish_reason == "stop"


def test_the_finish_of_a_choice_past_its_cap_is_dropped() -> None:
    scanner = several(OutputLimit(tokens=1))
    scanner.feed(event(choices((0, "a"))))
    assert scanner.feed(event(choices((0, None), finish="stop"))) == b""
    assert scanner.tally.finish_reason is None and scanner.tally.content_chunks == 1


def test_a_choice_without_an_index_counts_as_the_first() -> None:
    scanner = several(OutputLimit(tokens=1))
    chunk = {**HEAD, "choices": [{"delta": {"content": "a"}}]}
    out = parsed(scanner.feed(event(chunk)))
    assert out == [{**HEAD, "choices": [{"delta": {"content": "a"}, "finish_reason": "length"}]}]
    assert scanner.feed(event(choices((0, "b")))) == b""


def test_content_that_is_no_string_under_several_caps() -> None:
    scanner = several(OutputLimit(tokens=1))
    data = event({**HEAD, "choices": [{"index": 0, "delta": {"content": 7}}]})
    assert scanner.feed(data) == data and scanner.tally.content_chunks == 0


def test_a_choice_that_is_no_object_under_several_caps_is_kept() -> None:
    scanner = several(OutputLimit(tokens=1))
    data = event({**HEAD, "choices": ["x", {"index": 0, "delta": {"content": ""}}]})
    assert scanner.feed(data) == data


def test_a_chunk_left_empty_goes_only_when_it_carries_usage_asked_for() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2}
    for forward, expected in ((True, [{**HEAD, "choices": [], "usage": usage}]), (False, [])):
        scanner = several(OutputLimit(tokens=1), forward_usage=forward)
        scanner.feed(event(choices((0, "a"))))
        out = scanner.feed(event({**choices((0, "b")), "usage": usage}))
        assert parsed(out) == expected
    scanner = several(OutputLimit(tokens=1))
    scanner.feed(event(choices((0, "a"))))
    assert scanner.feed(event(choices((0, "b")))) == b""


# -- ending ----------------------------------------------------------------------------------------------------------

def test_the_ending_of_a_chat_stream_exactly() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    scanner.feed(event(chat("a")))
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert scanner.ending("length", usage) == (
        event({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        + event({**HEAD, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
    assert scanner.ending() == b"data: [DONE]\n\n"


def test_the_ending_of_a_completions_stream_exactly() -> None:
    scanner = SseScanner("completions", forward_usage=True)
    scanner.feed(event(text("a")))
    assert scanner.ending("stop") == (
        event({**CHEAD, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}) + b"data: [DONE]\n\n")


def test_no_finish_chunk_once_every_capped_choice_said_length() -> None:
    scanner = several(OutputLimit(tokens=1))
    scanner.feed(event(choices((0, "a"), (1, "b"))))
    assert scanner.tally.capped
    assert scanner.ending("length") == b"data: [DONE]\n\n"
    usage = {"prompt_tokens": 1}
    assert scanner.ending("length", usage) == event({**HEAD, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"


def test_a_finish_chunk_when_several_outputs_are_not_all_capped() -> None:
    scanner = several(OutputLimit(tokens=5))
    scanner.feed(event(choices((0, "a"))))
    assert scanner.ending("stop").startswith(
        event({**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))


# -- what the scanner forwards as it came, and the rest of the survivors ------------------------------------------

SPACED = b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "abc"}}]}\n\n'  # not orjson's bytes


def test_a_chunk_reaching_the_char_cap_exactly_is_forwarded_as_it_came() -> None:
    scanner = SseScanner("chat", forward_usage=True, limit=OutputLimit(chars=3))
    assert scanner.feed(SPACED) == SPACED  # nothing trimmed: not re-encoded
    assert scanner.tally.capped


def test_an_untouched_chunk_of_several_outputs_is_forwarded_as_it_came() -> None:
    scanner = several(OutputLimit(tokens=5))
    assert scanner.feed(SPACED) == SPACED


def test_a_chat_choice_without_a_delta() -> None:
    chunk = {**HEAD, "choices": [{"index": 0, "finish_reason": "stop"}]}
    single = SseScanner("chat", forward_usage=True)
    assert single.feed(event(chunk)) == event(chunk) and single.tally.finish_reason == "stop"
    capped = several(OutputLimit(tokens=1))
    assert capped.feed(event(chunk)) == event(chunk) and capped.tally.finish_reason == "stop"
    assert capped.tally.content_chunks == 0


def test_the_first_token_time_under_several_caps() -> None:
    scanner = several(OutputLimit(tokens=5))
    scanner.feed(event(choices((0, ""))))
    assert scanner.tally.first_token_at is None
    scanner.feed(event(choices((0, "a"))))
    first = scanner.tally.first_token_at
    scanner.feed(event(choices((1, "b"))))
    assert first is not None and scanner.tally.first_token_at == first


def test_a_pending_line_goes_out_with_the_event_it_starts() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    assert scanner.feed(b"event: message\n") == b"" and scanner.pending == b"event: message\n"
    data = event(chat("a"))
    assert scanner.feed(data) == b"event: message\n" + data
    assert scanner.pending == b"" and scanner.tally.content_chunks == 1


def test_blank_events_between_events_are_skipped_not_the_end() -> None:
    scanner = SseScanner("chat", forward_usage=True)
    data = event(chat("a")) + b"\n\n" + event(chat("b"))
    assert scanner.feed(data) == data
    assert scanner.tally.content_chunks == 2
