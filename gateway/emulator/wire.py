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
from .tokens import VOCAB, VOCAB_JSON, detokenize

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


def chat_logprobs(entries: Sequence[tuple[float, list[tuple[int, float]]]], ids: Sequence[int]) -> dict[str, Any]:
    """A chat choice's `logprobs`: {"content": [{token, logprob, bytes, top_logprobs}]} (OpenAI's shape)."""
    def one(tok: int, lp: float) -> dict[str, Any]:
        text = VOCAB[tok]
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}
    return {"content": [{**one(tok, lp), "top_logprobs": [one(a, alp) for a, alp in alts]}
                        for tok, (lp, alts) in zip(ids, entries)]}


def completion_logprobs(
    entries: Sequence[tuple[float, list[tuple[int, float]]]], ids: Sequence[int], offset: int = 0
) -> dict[str, Any]:
    """A completion choice's `logprobs`: parallel lists (text_offset, token_logprobs, tokens, top_logprobs),
    the top_logprobs dicts holding at least the chosen token, as vLLM's."""
    offsets, at = [], offset
    for tok in ids:
        offsets.append(at)
        at += len(VOCAB[tok])
    return {
        "text_offset": offsets, "token_logprobs": [lp for lp, _ in entries],
        "tokens": [VOCAB[t] for t in ids],
        "top_logprobs": [{VOCAB[a]: alp for a, alp in (alts or [(tok, lp)])}
                         for tok, (lp, alts) in zip(ids, entries)],
    }


class ChoiceFormatter:
    """Chunks of a stream with several choices (n > 1, prompt lists) or log-probabilities: each chunk one choice
    of one token, as vLLM streams them; built with orjson (the one-choice stream keeps `StreamFormatter`)."""

    __slots__ = ("chat", "_base", "_end")

    def __init__(self, kind: Kind, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.chat = kind == "chat"
        obj = b"chat.completion.chunk" if self.chat else b"text_completion"
        self._base = (b'data: {"id":' + orjson.dumps(rid) + b',"object":"' + obj + b'","created":'
                      + str(created).encode() + b',"model":' + orjson.dumps(model) + b',"choices":[')
        self._end = b"]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return self._base + orjson.dumps(choice) + self._end

    def role(self, index: int) -> bytes:
        return self._chunk({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def token(self, index: int, tok: int, logprobs: dict[str, Any] | None) -> bytes:
        body: dict[str, Any] = {"delta": {"content": VOCAB[tok]}} if self.chat else {"text": VOCAB[tok]}
        return self._chunk({"index": index, **body, "logprobs": logprobs, "finish_reason": None})

    def finish(self, index: int, reason: str) -> bytes:
        body: dict[str, Any] = {"delta": {}} if self.chat else {"text": ""}
        return self._chunk({"index": index, **body, "logprobs": None, "finish_reason": reason})

    def usage(self, prompt: int, completion: int, cached: int) -> bytes:
        return self._base + b'],"usage":' + orjson.dumps(_usage(prompt, completion, cached)) + b"}\n\n"


def choices_body(
    kind: Kind, rid: str, created: int, model: str,
    choices: Sequence[tuple[Sequence[int], str, dict[str, Any] | None]], prompt: int, cached: int,
) -> bytes:
    """A non-streaming body of several choices ((ids, finish_reason, logprobs) each, indexed in order); usage
    sums every choice's tokens."""
    out: list[dict[str, Any]] = []
    for i, (ids, reason, logprobs) in enumerate(choices):
        choice: dict[str, Any] = {"index": i, "logprobs": logprobs, "finish_reason": reason}
        if kind == "chat":
            choice["message"] = {"role": "assistant", "content": detokenize(ids)}
        else:
            choice["text"] = detokenize(ids)
        out.append(choice)
    return orjson.dumps({
        "id": rid, "object": "chat.completion" if kind == "chat" else "text_completion",
        "created": created, "model": model, "choices": out,
        "usage": _usage(prompt, sum(len(ids) for ids, _, _ in choices), cached),
    })
