"""A fake OpenAI upstream: answers every chat request with exactly the bytes it was given, and keeps the
request bodies it received (`app[SEEN]`). Serve it with `gateway.server.running`."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

SEEN = web.AppKey("seen", list[dict[str, Any]])  # the bodies the upstream received, in order


def sse_event(obj: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying `obj` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
    """A chat.completion.chunk event with these choices (and `usage=...` or other top-level fields)."""
    return sse_event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices,
                      **extra})


def content(text: str, finish: str | None = None) -> bytes:
    """A chunk carrying `text` (and the finish reason, on the last one)."""
    return chunk([{"index": 0, "delta": {"content": text}, "finish_reason": finish}])


DONE = b"data: [DONE]\n\n"
USAGE_EVENT = chunk([], usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7})
# A complete answer as vLLM streams it: the role, a comment line, "Hé" "llo" "!" (stop), usage 4 + 3, [DONE].
CHAT_STREAM = (chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
               + b": comment lines pass too\n\n" + content("Hé") + content("llo") + content("!", "stop")
               + USAGE_EVENT + DONE)


def scripted_upstream(pieces: Sequence[bytes], delay_s: float = 0.0) -> web.Application:
    """An upstream that streams exactly `pieces` (arbitrary boundaries, even inside UTF-8) to every POST
    /v1/chat/completions, sleeping `delay_s` after each; the bodies it received are in `app[SEEN]`."""
    seen: list[dict[str, Any]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(delay_s)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app[SEEN] = seen
    return app
