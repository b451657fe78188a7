"""OpenAI wire format: prebuilt SSE chunk templates, JSON bodies and error replies.

Per token the stream costs one bytes concatenation: the chunk's JSON is split into a
head and a tail around the (pre-escaped) token text when the stream starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from .parse import Kind
from .tokens import VOCAB_JSON, detokenize

DONE = b"data: [DONE]\n\n"
MALFORMED = b'data: {"id": <<malformed-by-emulator-fault>>\n\n'
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": cached},
    }


class StreamFormatter:
    """Byte templates for one stream's chunks (`chat.completion.chunk` or `text_completion`)."""

    __slots__ = ("chat", "_base", "_head", "_tail", "_end")

    def __init__(self, kind: Kind, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.chat = kind == "chat"
        obj = b"chat.completion.chunk" if self.chat else b"text_completion"
        self._base = (b'data: {"id":' + orjson.dumps(rid) + b',"object":"' + obj + b'","created":'
                      + str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":[')
        self._end = b"]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"
        key = b'{"index":0,"delta":{"content":' if self.chat else b'{"index":0,"text":'
        self._head = self._base + key
        close = b"}" if self.chat else b""
        self._tail = close + b',"logprobs":null,"finish_reason":null}' + self._end

    def role(self) -> bytes:
        """The first chat chunk: `delta.role` with empty content."""
        return (self._base + b'{"index":0,"delta":{"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null}' + self._end)

    def tokens(self, ids: Sequence[int]) -> bytes:
        """One chunk per token, concatenated for a single write."""
        head, tail = self._head, self._tail
        return b"".join([head + VOCAB_JSON[i] + tail for i in ids])

    def finish(self, reason: str) -> bytes:
        choice = b'{"index":0,"delta":{},' if self.chat else b'{"index":0,"text":"",'
        end = b'"logprobs":null,"finish_reason":"' + reason.encode() + b'"}' + self._end
        return self._base + choice + end

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        """The include_usage chunk: empty choices and the usage object."""
        return self._base + b'],"usage":' + orjson.dumps(_usage(prompt, completion, cached)) + b"}\n\n"


def completion_body(
    kind: Kind, rid: str, created: int, model: str, ids: Sequence[int], reason: str,
    prompt: int, cached: int,
) -> bytes:
    """A non-streaming `chat.completion` or `text_completion` body."""
    text = detokenize(ids)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return orjson.dumps({
        "id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created, "model": model, "choices": [choice],
        "usage": _usage(prompt, len(ids), cached),
    })


def error_response(
    status: int, message: str, err_type: str, *, param: str | None = None,
    code: str | None = None, headers: dict[str, str] | None = None,
) -> web.Response:
    """An OpenAI-style error reply (the one place errors are translated)."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), headers=headers,
                        content_type="application/json")
