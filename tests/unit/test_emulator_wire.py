"""Emulator faults, request parsing and SSE byte templates."""

from __future__ import annotations

import orjson
import pytest

from gateway.emulator.faults import FaultConfig, FaultInjector
from gateway.emulator.parse import BadRequest, parse_body
from gateway.emulator.tokens import VOCAB, tokenize
from gateway.emulator.wire import DONE, StreamFormatter, completion_body


def events(raw: bytes) -> list[dict[str, object]]:
    assert raw.endswith(b"\n\n")
    out = []
    for block in raw.split(b"\n\n")[:-1]:
        assert block.startswith(b"data: ")
        out.append(orjson.loads(block[6:]))
    return out


def test_fault_draws_are_seeded_and_respect_rates() -> None:
    cfg = FaultConfig(error_rate=0.3, rate_limit_rate=0.2)

    def pattern(seed: int) -> list[tuple[bool, bool]]:
        inj = FaultInjector(seed, cfg)
        return [(d.error, d.rate_limit) for d in (inj.draw() for _ in range(400))]

    assert pattern(1) == pattern(1)
    assert pattern(1) != pattern(2)
    p = pattern(1)
    errors, limited = sum(e for e, _ in p), sum(r for _, r in p)
    assert 0.15 < errors / 400 < 0.35 and 0.1 < limited / 400 < 0.3
    assert not any(e and r for e, r in p)
    assert not any(d.error or d.stall_s for d in (FaultInjector(1).draw() for _ in range(50)))


def test_fault_config_from_dict_validates() -> None:
    cfg = FaultConfig.from_dict({"stall_s": 0.5, "disconnect_after_tokens": 3, "malformed_sse": True})
    assert (cfg.stall_s, cfg.disconnect_after_tokens, cfg.malformed_sse) == (0.5, 3, True)
    bad: object
    llama_like = FaultConfig.from_dict({"omit_finish_reason": True, "omit_usage": True})
    assert (llama_like.omit_finish_reason, llama_like.omit_usage) == (True, True)
    for bad in ({"nope": 1}, {"error_rate": 2.0}, {"error_rate": "x"}, {"malformed_sse": 1}, {"omit_usage": 1}, []):
        with pytest.raises(ValueError):
            FaultConfig.from_dict(bad)


def test_stream_chunks_are_openai_wire_format() -> None:
    fmt = StreamFormatter("chat", "chatcmpl-1", 123, "my-model", include_usage=True)
    raw = fmt.role() + fmt.tokens([0, 1, len(VOCAB) - 1]) + fmt.finish("length") + fmt.usage(5, 3, 0)
    evs = events(raw)
    assert [e["object"] for e in evs] == ["chat.completion.chunk"] * 6
    assert evs[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "logprobs": None, "finish_reason": None}]
    texts = [e["choices"][0]["delta"]["content"] for e in evs[1:4]]  # type: ignore[index]
    assert texts == [VOCAB[0], VOCAB[1], VOCAB[-1]]
    assert evs[4]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert evs[5]["choices"] == [] and evs[5]["usage"]["total_tokens"] == 8  # type: ignore[index]
    assert all(e["usage"] is None for e in evs[:5]) and all(e["model"] == "my-model" for e in evs)


def test_completion_chunks_and_body() -> None:
    fmt = StreamFormatter("completion", "cmpl-1", 1, "m", include_usage=False)
    evs = events(fmt.tokens([2]) + fmt.finish("stop"))
    assert evs[0]["object"] == "text_completion" and "usage" not in evs[0]
    assert evs[0]["choices"][0]["text"] == VOCAB[2]  # type: ignore[index]
    body = orjson.loads(completion_body("chat", "c", 1, "m", [0, 1], "stop", 4, 0))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": VOCAB[0] + VOCAB[1]}
    assert body["usage"]["completion_tokens"] == 2 and DONE == b"data: [DONE]\n\n"


def test_parse_chat_and_completion_bodies() -> None:
    req = parse_body(orjson.dumps({
        "model": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
        "max_completion_tokens": 9, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": 4,
    }), "chat")
    assert (req.max_tokens, req.stream, req.include_usage, req.ignore_eos, req.seed) == (9, True, True, True, 4)
    assert "hi" in req.prompt and "user" in req.prompt
    comp = parse_body(b'{"model": "x", "prompt": [1, 2, 3]}', "completion")
    assert comp.prompt == [1, 2, 3] and comp.max_tokens is None and not comp.include_usage
    assert tokenize("Hello, world!") == ["Hello", ",", "world", "!"]


@pytest.mark.parametrize("body", [
    b"not json", b"[]", b'{"messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "m", "messages": []}', b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
    b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}',
])
def test_parse_rejects_bad_bodies(body: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_body(body, "chat")
