"""A whole (non-streamed) answer, settled into the request's context: its usage, finish reason and text, and
each choice cut to the tenant's character cap (finish_reason "length"); a Responses answer as its tier sent it."""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.backends.h1 import Response
from gateway.backends.stats import server_decode_s
from gateway.backends.upstream import Retry, read_answer
from gateway.config import Replica
from gateway.context import RequestContext
from gateway.errors import UpstreamError
from gateway.protocols.native import is_native, settle as settle_native
from gateway.types import JsonReply
from gateway.upstream.sink import apply_usage


async def settle_json(ctx: RequestContext, response: Response, replica: Replica) -> tuple[JsonReply, float | None]:
    """The answer for the client, and the seconds it spent decoding when the server says (`server_decode_s`)."""
    data = await read_answer(response, replica)
    ctx.upstream.first_token_at = time.perf_counter()
    try:
        answer = orjson.loads(data)
        if is_native(ctx):
            return _settle_native(ctx, answer, data), None
        choices = answer["choices"]
        choice = choices[0]
        for each in choices:  # (a loop: `all` over a generator is two more calls per request)
            if not isinstance(each, dict):
                raise TypeError("a choice is not an object")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise Retry(UpstreamError(f"backend {replica.name} sent a malformed answer")) from None
    apply_usage(ctx, answer.get("usage"))  # the backend's own counts: the tokens it wrote, cut or not
    cap = ctx.tenant.output_cap.chars if ctx.tenant and ctx.tenant.output_cap else None
    if cap is not None and _trim_answer(choices, cap):
        data, ctx.upstream.output_capped = orjson.dumps(answer), True
    ctx.upstream.finish_reason = choice.get("finish_reason")
    ctx.upstream.response_text = _text_of(choice)
    return JsonReply(200, data), server_decode_s(answer)

def _settle_native(ctx: RequestContext, answer: Any, data: bytes) -> JsonReply:
    """A Responses answer (one output) as its tier sent it, its text cut to the tenant's character cap:
    status "incomplete" (max_output_tokens), as when the backend stops at the token cap."""
    ctx.upstream.response_text = settle_native(ctx, answer)
    cap = ctx.tenant.output_cap.chars if ctx.tenant and ctx.tenant.output_cap else None
    if cap is None or ctx.upstream.response_text is None or len(ctx.upstream.response_text) <= cap:
        return JsonReply(200, data)
    left = cap
    for item in answer.get("output") or ():
        for part in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                part["text"] = part["text"][:left]
                left -= len(part["text"])
    answer["status"], answer["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
    ctx.upstream.response_text, ctx.upstream.finish_reason, ctx.upstream.output_capped = ctx.upstream.response_text[:cap], "length", True
    return JsonReply(200, orjson.dumps(answer))


def _text_of(choice: dict[str, Any]) -> str | None:
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text if isinstance(text, str) else None


def _trim_answer(choices: list[dict[str, Any]], cap: int) -> bool:
    """Cut every choice's text to the tenant's character cap (finish_reason "length"); whether any was cut."""
    cut = False
    for choice in choices:
        text = _text_of(choice)
        if text is None or len(text) <= cap:
            continue
        if isinstance(choice.get("message"), dict):
            choice["message"] = {**choice["message"], "content": text[:cap]}
        else:
            choice["text"] = text[:cap]
        choice["finish_reason"] = "length"
        cut = True
    return cut


