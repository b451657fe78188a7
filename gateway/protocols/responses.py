"""POST /v1/responses (OpenAI Responses, stateless subset) translated to chat completions and back.

Accepted: `input` (a string, or message items with text content), `instructions`, `max_output_tokens`,
`temperature`, `top_p`, `stream`, `metadata`, `user`. Refused with a 400 naming the field:
`previous_response_id` and `store: true` (no response storage), tools and other stateful features.
Errors keep the OpenAI shape; fields named by the stages are renamed to the Responses ones.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.context import RequestContext
from gateway.errors import GatewayError, InvalidRequest
from gateway.protocols.base import ChatAnswer, copy_fields, refuse, sse, text_parts

ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_TYPES = frozenset({"input_text", "output_text", "text"})
UNSUPPORTED = ("previous_response_id", "conversation", "store", "background", "tools", "prompt", "reasoning")
CHAT_FIELDS = {"model": "model", "max_output_tokens": "max_tokens", "temperature": "temperature",
               "top_p": "top_p", "stream": "stream", "user": "user"}
RENAMED = {"max_tokens": "max_output_tokens", "messages": "input"}  # chat fields the stages may name
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class ResponsesWire:
    name: str = "responses"
    key_header: str | None = None

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        refuse(body, UNSUPPORTED, "this gateway serves the stateless subset of the Responses API")
        messages = _messages(body.get("input"))
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise InvalidRequest("'instructions' must be a string", param="instructions")
            messages.insert(0, {"role": "system", "content": instructions})
        chat = {**copy_fields(body, CHAT_FIELDS), "messages": messages}
        if chat.get("stream") is True:
            chat["stream_options"] = {"include_usage": True}
        return chat

    def render(self, ctx: RequestContext, answer: ChatAnswer) -> bytes:
        return orjson.dumps(_response(ctx, answer, "completed"))

    def events(self, ctx: RequestContext) -> ResponseEvents:
        return ResponseEvents(ctx)

    def error_body(self, err: GatewayError) -> bytes:
        param = RENAMED.get(err.param or "", err.param)
        message = err.message
        if param != err.param:
            message = message.replace(f"'{err.param}'", f"'{param}'")
        return orjson.dumps({"error": {"message": message, "type": err.type, "param": param, "code": err.code}})


def _messages(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise InvalidRequest("'input' is required: a string or a non-empty array of messages", param="input")
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") not in ROLES:
            raise InvalidRequest(f"'input[{i}]' must be a message with role {', '.join(sorted(ROLES))} (tool and "
                                 "reasoning items are not supported)", param=f"input[{i}]")
        content = text_parts(item.get("content"), f"input[{i}].content", TEXT_TYPES)
        messages.append({"role": item["role"], "content": content})
    return messages


def _response(ctx: RequestContext, answer: ChatAnswer | None, status: str) -> dict[str, Any]:
    """The `response` object: in progress (no answer yet) or finished."""
    body = ctx.body
    response: dict[str, Any] = {
        "id": f"resp_{ctx.request_id}", "object": "response", "created_at": int(ctx.ts), "status": status,
        "model": answer.model if answer else ctx.model_requested, "output": [], "error": None,
        "incomplete_details": None, "instructions": None, "max_output_tokens": ctx.max_tokens,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"), "user": body.get("user"),
        "metadata": {}, "parallel_tool_calls": False, "tool_choice": "none", "tools": [],
        "text": {"format": {"type": "text"}}, "store": False, "usage": None,
    }
    if answer is not None:
        if (reason := INCOMPLETE.get(answer.finish_reason or "")) is not None and status == "completed":
            response["status"], response["incomplete_details"] = "incomplete", {"reason": reason}
        response["output"] = [_item(ctx, answer.text, "completed")]
        response["usage"] = {
            "input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens,
            "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            "input_tokens_details": {"cached_tokens": ctx.upstream.cached_tokens},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    return response


def _item(ctx: RequestContext, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    return {"type": "message", "id": f"msg_{ctx.request_id}", "status": status, "role": "assistant",
            "content": content}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseEvents:
    """The Responses event sequence: created, in_progress, item and part added, text deltas, the dones,
    then completed (or incomplete) with usage; `response.failed` when the stream breaks."""

    def __init__(self, ctx: RequestContext) -> None:
        self._ctx = ctx
        self._seq = 0
        self._at = {"item_id": f"msg_{ctx.request_id}", "output_index": 0}
        self._delta = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"msg_'
                       + ctx.request_id.encode() + b'","output_index":0,"content_index":0,"logprobs":[],'
                       b'"sequence_number":')

    def _emit(self, kind: str, **data: Any) -> bytes:
        self._seq += 1
        return sse(kind, {"type": kind, "sequence_number": self._seq - 1, **data})

    def start(self, model: str) -> bytes:
        response = _response(self._ctx, None, "in_progress")
        return (self._emit("response.created", response=response)
                + self._emit("response.in_progress", response=response)
                + self._emit("response.output_item.added", output_index=0, item=_item(self._ctx, None, "in_progress"))
                + self._emit("response.content_part.added", **self._at, content_index=0, part=_part("")))

    def text(self, delta: str) -> bytes:  # the one event per token: its bytes around the text, written once
        self._seq += 1
        return self._delta + str(self._seq - 1).encode() + b',"delta":' + orjson.dumps(delta) + b"}\n\n"

    def end(self, answer: ChatAnswer) -> bytes:
        response = _response(self._ctx, answer, "completed")
        done = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return (self._emit("response.output_text.done", **self._at, content_index=0, text=answer.text, logprobs=[])
                + self._emit("response.content_part.done", **self._at, content_index=0, part=_part(answer.text))
                + self._emit("response.output_item.done", output_index=0, item=response["output"][0])
                + self._emit(done, response=response))

    def fail(self, message: str, code: str) -> bytes:
        response = _response(self._ctx, None, "failed")
        response["error"] = {"code": code, "message": message}
        return self._emit("response.failed", response=response)

