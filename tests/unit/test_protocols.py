"""The stream translator on its own: chat SSE cut anywhere, a broken stream, the protocols' bodies."""

from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.protocols.anthropic import AnthropicWire
from gateway.protocols.base import TranslatedStream, Wire
from gateway.protocols.responses import ResponsesWire
from gateway.testing import gateway_config, tier

CONFIG = gateway_config([tier("t", ["http://127.0.0.1:1/v1"])])


def chat_stream(pieces: list[str], *, broken: bool = False) -> bytes:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**head, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    if broken:
        events.append({"error": {"message": "the backend stream broke off", "code": "upstream_stream_broken"}})
        return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    events += [{**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
               {**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(pieces)}}]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class Source:
    def __init__(self, data: bytes, cut: int) -> None:
        self.parts = [data[i:i + cut] for i in range(0, len(data), cut)]
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        for part in self.parts:
            yield part

    def close(self) -> None:
        self.closed = True


async def translate(wire: Wire, data: bytes, cut: int) -> list[tuple[str, dict[str, object]]]:
    ctx = RequestContext("r1", "chat", CONFIG, b"", None, 0.0, 0.0, wire)
    source = Source(data, cut)
    stream = TranslatedStream(source, wire.events(ctx), ctx)
    out = b"".join([chunk async for chunk in stream.chunks()])
    stream.close()
    assert source.closed
    events = []
    for raw in out.split(b"\n\n")[:-1]:
        name, data_line = raw.split(b"\n")
        events.append((name.removeprefix(b"event: ").decode(), orjson.loads(data_line.removeprefix(b"data: "))))
    return events


@pytest.mark.parametrize("cut", [7, 50, 100_000])
async def test_anthropic_events_from_a_chat_stream_cut_anywhere(cut: int) -> None:
    events = await translate(AnthropicWire(), chat_stream(["Hel", "lo", " \"world\"\n"]), cut)
    names = [name for name, _ in events]
    assert names == ["message_start", "content_block_start", *["content_block_delta"] * 3, "content_block_stop",
                     "message_delta", "message_stop"]
    texts = [str(e["delta"]["text"]) for n, e in events if n == "content_block_delta"]  # type: ignore[index]
    assert "".join(texts) == 'Hello "world"\n'
    assert events[-2][1]["usage"] == {"input_tokens": 5, "output_tokens": 3}
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


async def test_a_broken_stream_ends_in_each_protocols_failure_event() -> None:
    anthropic = await translate(AnthropicWire(), chat_stream(["a"], broken=True), 1000)
    assert anthropic[-1][0] == "error" and anthropic[-1][1]["error"]["type"] == "api_error"  # type: ignore[index]
    responses = await translate(ResponsesWire(), chat_stream(["a"], broken=True), 1000)
    assert responses[-1][0] == "response.failed"
    assert responses[-1][1]["response"]["error"]["code"] == "upstream_stream_broken"  # type: ignore[index]
    assert [e["sequence_number"] for _, e in responses] == list(range(len(responses)))


def test_request_bodies_become_chat_bodies() -> None:
    chat = ResponsesWire().to_chat({"model": "m", "instructions": "Be brief.", "max_output_tokens": 5, "stream": True,
                                    "input": [{"type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": "hi"}]}]})
    assert chat == {"model": "m", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True},
                    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    chat = AnthropicWire().to_chat({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "S"}],
                                    "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
                                    "messages": [{"role": "user", "content": "hi"}]})
    assert chat == {"model": "m", "max_tokens": 9, "stop": ["END"], "user": "u1",
                    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest) as caught:
        AnthropicWire().to_chat({"model": "m", "max_tokens": 9, "messages": [{"role": "system", "content": "x"}]})
    assert caught.value.param == "messages[0].role"
    with pytest.raises(InvalidRequest) as hot:  # Anthropic's range is 0 to 1 (chat's is 0 to 2)
        AnthropicWire().to_chat({"model": "m", "max_tokens": 9, "temperature": 1.5, "messages": []})
    assert hot.value.param == "temperature"
