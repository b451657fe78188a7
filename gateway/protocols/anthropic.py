"""POST /v1/messages (Anthropic Messages) translated to chat completions and back.

Accepted: `model`, `max_tokens` (required), `system` (a string or text blocks), `messages` (user and
assistant turns, text content blocks), `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`,
`metadata.user_id`; the key in `x-api-key` or `Authorization: Bearer`. Tools and images are refused
with a 400 naming the field. Errors are Anthropic's: {"type": "error", "error": {"type", "message"}}
(an unknown model: 404 not_found_error). An answer that ended at one of `stop_sequences` says
stop_reason "stop_sequence" and the sequence when the backend tells which one matched (vLLM, SGLang; a llama.cpp
server the gateway launched, asked with `verbose`).

POST /v1/messages/count_tokens: gateway.protocols.anthropic_count.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import Replica
from gateway.config.routes import LlamaCppLaunch
from gateway.context import RequestContext
from gateway.errors import GatewayError, InvalidRequest
from gateway.protocols.base import ChatAnswer, copy_fields, refuse, sse, text_parts

ROLES = frozenset({"user", "assistant"})
TEXT = frozenset({"text"})
CHAT_FIELDS = {"model": "model", "max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
               "top_k": "top_k", "stream": "stream"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}
ERROR_TYPES = {404: "not_found_error", 413: "request_too_large", 502: "api_error", 504: "api_error",
               503: "overloaded_error"}
RENAMED = {"stop": "stop_sequences"}
TEXT_DELTA = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
              b'"delta":{"type":"text_delta","text":')


class AnthropicWire:
    name: str = "messages"
    key_header: str | None = "x-api-key"

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        refuse(body, ("tools", "tool_choice", "thinking", "container", "mcp_servers"),
               "this gateway serves text messages only")
        if not isinstance(body.get("max_tokens"), int):
            raise InvalidRequest("'max_tokens' is required and must be an integer", param="max_tokens")
        temperature = body.get("temperature")
        if isinstance(temperature, (int, float)) and not 0 <= temperature <= 1:
            raise InvalidRequest(f"'temperature' must be between 0 and 1, got {temperature}", param="temperature")
        messages = _messages(body.get("messages"))
        system = body.get("system")
        if system is not None:
            messages.insert(0, {"role": "system", "content": text_parts(system, "system", TEXT)})
        chat = {**copy_fields(body, CHAT_FIELDS), "messages": messages}
        stops = body.get("stop_sequences")
        if stops is not None:
            if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(s, str) for s in stops):
                raise InvalidRequest("'stop_sequences' must be an array of at most 4 strings", param="stop_sequences")
            chat["stop"] = stops
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
            chat["user"] = metadata["user_id"]
        if chat.get("stream") is True:
            chat["stream_options"] = {"include_usage": True}
        return chat

    def render(self, ctx: RequestContext, answer: ChatAnswer) -> bytes:
        message = _message(ctx, answer.model, [{"type": "text", "text": answer.text}])
        message["stop_reason"], message["stop_sequence"] = stop_of(answer)
        message["usage"] = {"input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens}
        return orjson.dumps(message)

    def events(self, ctx: RequestContext) -> MessageEvents:
        return MessageEvents(ctx)

    def error_body(self, err: GatewayError) -> bytes:
        kind = ERROR_TYPES.get(err.status, err.type if err.status < 500 else "api_error")
        message = err.message
        if err.param in RENAMED:
            message = message.replace(f"'{err.param}'", f"'{RENAMED[err.param]}'")
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def wants_stop_word(ctx: RequestContext, replica: Replica) -> bool:
    """Whether to ask `replica` which stop word ended the answer (`verbose: true`): a Messages request with stop
    sequences to a llama.cpp server the gateway launched. llama-server says it only in its `__verbose` debug field,
    and only when asked; vLLM and SGLang say it unasked, and other servers may refuse the unknown field."""
    return (ctx.wire is not None and ctx.wire.name == AnthropicWire.name and bool(ctx.body.get("stop"))
            and isinstance(replica.launch, LlamaCppLaunch))


def stop_of(answer: ChatAnswer) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): "stop_sequence" with the sequence when the backend said which one ended the
    answer, else the chat finish reason's counterpart."""
    if answer.stop_sequence is not None and answer.finish_reason in (None, "stop"):
        return "stop_sequence", answer.stop_sequence
    return STOP_REASONS.get(answer.finish_reason or "stop", "end_turn"), None


def _messages(turns: Any) -> list[dict[str, Any]]:
    if not isinstance(turns, list) or not turns:
        raise InvalidRequest("'messages' is required and must be a non-empty array", param="messages")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES:
            raise InvalidRequest(f"'messages[{i}].role' must be 'user' or 'assistant'", param=f"messages[{i}].role")
        messages.append({"role": turn["role"], "content": text_parts(turn.get("content"), f"messages[{i}].content",
                                                                      TEXT)})
    return messages


def _message(ctx: RequestContext, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": f"msg_{ctx.request_id}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}


class MessageEvents:
    """message_start, content_block_start, text deltas, content_block_stop, message_delta (stop reason and
    usage: the input tokens are known only at the end, so they come here too), message_stop."""

    def __init__(self, ctx: RequestContext) -> None:
        self._ctx = ctx

    def start(self, model: str) -> bytes:
        return (sse("message_start", {"type": "message_start", "message": _message(self._ctx, model, [])})
                + sse("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}}))

    def text(self, delta: str) -> bytes:  # the one event per token: its bytes around the text, written once
        return TEXT_DELTA + orjson.dumps(delta) + b"}}\n\n"

    def end(self, answer: ChatAnswer) -> bytes:
        reason, sequence = stop_of(answer)
        usage = {"input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens}
        return (sse("content_block_stop", {"type": "content_block_stop", "index": 0})
                + sse("message_delta", {"type": "message_delta", "usage": usage,
                                        "delta": {"stop_reason": reason, "stop_sequence": sequence}})
                + sse("message_stop", {"type": "message_stop"}))

    def fail(self, message: str, code: str) -> bytes:
        return sse("error", {"type": "error", "error": {"type": "api_error", "message": f"{message} ({code})"}})
