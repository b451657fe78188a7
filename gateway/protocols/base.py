"""What every translated protocol shares: the Wire protocol, the chat answer, and the stream translator.

A Wire turns its protocol's body into a chat completions body (`to_chat`, raising InvalidRequest
naming its own field), renders a chat answer in its own shape, writes its stream events from what
the chat stream says (`events`), and writes errors in its own shape. Everything between parse and
the edge works on the chat body, so the stages, the cache and the accounting are the chat ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway.context import RequestContext
from gateway.errors import GatewayError, InvalidRequest
from gateway.protocols.native import is_native
from gateway.sse import DONE, complete_prefix_end, data_of
from gateway.types import ChunkSource, ClientWire, JsonReply, Reply, StreamReply


@dataclass(slots=True)
class ChatAnswer:
    """A finished chat answer, as a protocol renders it."""

    text: str
    finish_reason: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None  # the stop sequence the backend says it stopped at (`matched_stop`)


class Events(Protocol):
    """One stream's events in a protocol's shape."""

    def start(self, model: str) -> bytes: ...

    def text(self, delta: str) -> bytes: ...

    def end(self, answer: ChatAnswer) -> bytes: ...

    def fail(self, message: str, code: str) -> bytes: ...


class Wire(ClientWire, Protocol):
    """A client protocol translated to chat completions at the edge: parsed as a chat body, its answer
    rendered back, its errors in its own shape."""

    def render(self, ctx: RequestContext, answer: ChatAnswer) -> bytes: ...

    def events(self, ctx: RequestContext) -> Events: ...


def render(wire: Wire, ctx: RequestContext, reply: Reply, count_tokens: Callable[[RequestContext], None]) -> Reply:
    """The stages' chat reply in the wire's shape; usage is the one the log line will carry. A tier serving the
    wire natively answered in it already."""
    if is_native(ctx):
        return reply
    if isinstance(reply, StreamReply):
        return StreamReply(TranslatedStream(reply.source, wire.events(ctx), ctx), reply.headers)
    count_tokens(ctx)  # the backend's usage, else counted: what accounting logs
    chat = orjson.loads(reply.body)
    choice = chat["choices"][0]
    message = choice.get("message") or {}
    answer = ChatAnswer(message.get("content") or "", ctx.upstream.finish_reason, str(chat.get("model", "")),
                        ctx.upstream.prompt_tokens or 0, ctx.upstream.completion_tokens or 0,
                        matched_stop(chat, choice) if ctx.upstream.finish_reason == "stop" else None)
    ctx.upstream.stop_sequence = answer.stop_sequence  # a cached copy replays it
    return JsonReply(reply.status, wire.render(ctx, answer), reply.headers)


class TranslatedStream:
    """A ChunkSource re-writing a chat completions SSE stream as a protocol's events."""

    def __init__(self, source: ChunkSource, events: Events, ctx: RequestContext) -> None:
        self._source = source
        self._events = events
        self._ctx = ctx
        self._answer = ChatAnswer("", None, "", 0, 0)
        self._pieces: list[str] = []
        self._started = False

    async def chunks(self) -> AsyncIterator[bytes]:
        pending = b""
        async for data in self._source.chunks():
            if pending or not data.endswith(b"\n\n"):
                buf = pending + data
                end = complete_prefix_end(buf)
                data, pending = buf[:end], buf[end:]
            if data.startswith(b"data: ") and data.find(b"\n", 6) == len(data) - 2:  # one event: most reads
                out = self._event(data[6:-2])
            else:
                out = b"".join(self._event(payload) for raw in data.split(b"\n\n")
                               if raw and (payload := data_of(raw)) is not None)
            if out:
                yield out

    def close(self) -> None:
        self._source.close()

    def _event(self, payload: bytes) -> bytes:
        answer = self._answer
        if payload == DONE:
            answer.text = "".join(self._pieces)
            self._ctx.upstream.stop_sequence = answer.stop_sequence  # a cached copy replays it
            return self._events.end(answer)
        chunk = orjson.loads(payload)  # the relay forwards only parsed events
        out = b""
        if "__verbose" in chunk:  # llama.cpp's, once, on the first event of the end (asked for: `wants_stop_word`)
            answer.stop_sequence = matched_stop(chunk, None)
        if not self._started:
            self._started, answer.model = True, str(chunk.get("model", ""))
            out = self._events.start(answer.model)
        if choices := chunk.get("choices"):
            choice = choices[0]  # n is 1: the protocols have no choices
            if reason := choice.get("finish_reason"):
                answer.finish_reason = reason
                answer.stop_sequence = matched_stop(chunk, choice) or answer.stop_sequence
            delta = choice.get("delta")
            if delta and (text := delta.get("content")):
                self._pieces.append(text)
                out += self._events.text(text)
        elif isinstance(error := chunk.get("error"), dict):
            return out + self._events.fail(str(error.get("message")), str(error.get("code")))
        if usage := chunk.get("usage"):
            answer.prompt_tokens, answer.completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        return out


def matched_stop(answer: dict[str, Any], choice: dict[str, Any] | None) -> str | None:
    """The stop sequence a backend says the answer (or stream event) ended at: vLLM's `stop_reason` (a string; a token
    id when a stop token ended it), SGLang's `matched_stop`, llama.cpp's `__verbose.stopping_word` (sent when asked
    with `verbose`: `gateway.protocols.anthropic.wants_stop_word`). None when it does not say, or no sequence did."""
    for key in ("stop_reason", "matched_stop"):
        value = choice.get(key) if choice is not None else None
        if isinstance(value, str) and value:
            return value
    verbose = answer.get("__verbose")
    word = verbose.get("stopping_word") if isinstance(verbose, dict) else None
    return word if isinstance(word, str) and word else None


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def text_parts(content: Any, where: str, types: frozenset[str]) -> str:
    """A message's content as text: a string, or an array of text parts of `types` (400 naming the part)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise InvalidRequest(f"'{where}' must be a string or a non-empty array of text parts", param=where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in types or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"'{where}[{i}]' must be a text part ({', '.join(sorted(types))}) with 'text'; "
                                 f"got type {kind!r}", param=f"{where}[{i}]")
        texts.append(part["text"])
    return "".join(texts)


def refuse(body: dict[str, Any], names: tuple[str, ...], why: str) -> None:
    """400 naming the first of `names` the body sets (truthy)."""
    for name in names:
        if body.get(name):
            raise InvalidRequest(f"'{name}' is not supported: {why}", param=name, code="unsupported_parameter")


def copy_fields(body: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The fields of `body` named in `names` (those present and not null), under their chat names."""
    return {chat: body[name] for name, chat in names.items() if body.get(name) is not None}
