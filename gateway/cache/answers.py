"""A cached answer: stored compactly in Redis, replayed as JSON or as an SSE stream."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from gateway.types import Endpoint


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model: str
    stop_sequence: str | None = None  # the stop sequence the backend said ended it: replayed as vLLM's `stop_reason`

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> CachedAnswer | None:
        """None for anything that is not a well-formed record (never trust what Redis holds)."""
        try:
            data = orjson.loads(raw)
            answer = cls(**data)
        except (orjson.JSONDecodeError, TypeError):
            return None
        ok = isinstance(answer.text, str) and isinstance(answer.prompt_tokens, int)
        return answer if ok and isinstance(answer.completion_tokens, int) else None


def _usage(answer: CachedAnswer) -> dict[str, int]:
    total = answer.prompt_tokens + answer.completion_tokens
    return {"prompt_tokens": answer.prompt_tokens, "completion_tokens": answer.completion_tokens,
            "total_tokens": total}


def _stop(answer: CachedAnswer) -> dict[str, str]:
    return {} if answer.stop_sequence is None else {"stop_reason": answer.stop_sequence}


def json_body(endpoint: Endpoint, answer: CachedAnswer, request_id: str) -> bytes:
    """The non-streaming OpenAI response for a cached answer."""
    if endpoint == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": answer.text},
                                  "finish_reason": answer.finish_reason, **_stop(answer)}
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": answer.text, "logprobs": None, "finish_reason": answer.finish_reason}
        head = {"id": f"cmpl-{request_id}", "object": "text_completion"}
    body = {**head, "created": int(time.time()), "model": answer.model, "choices": [choice],
            "usage": _usage(answer)}
    return orjson.dumps(body)


def sse_body(endpoint: Endpoint, answer: CachedAnswer, request_id: str, include_usage: bool) -> bytes:
    """The streaming OpenAI response for a cached answer: role, the text, the finish, [usage], [DONE]."""
    chat = endpoint == "chat"
    head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
            "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": answer.model}

    def event(choice: dict[str, Any] | None, **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": [choice] if choice else [], **extra}) + b"\n\n"

    def piece(text: str, finish: str | None) -> dict[str, Any]:
        if chat:
            return {"index": 0, "delta": {"content": text} if text else {}, "finish_reason": finish,
                    **(_stop(answer) if finish else {})}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    events = [event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})] if chat else []
    events += [event(piece(answer.text, None)), event(piece("", answer.finish_reason))]
    if include_usage:
        events.append(event(None, usage=_usage(answer)))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


class Replay:
    """A ChunkSource over bytes already in hand."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self._body

    def close(self) -> None:
        return None
