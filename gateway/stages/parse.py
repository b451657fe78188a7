"""Parse: decode and validate the OpenAI request body once, naming the field at fault."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.context import RequestContext
from gateway.errors import InvalidRequest
from gateway.protocols import embeddings
from gateway.reading import read
from gateway.types import Reply

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_TOKENS_CEILING = 1 << 20  # beyond any context window we could route to
MAX_MESSAGES = 2048
MAX_CHOICES = 16  # n and best_of
MAX_PROMPTS = 2048  # a completion's prompt list, as the embeddings' input list
MAX_DEPTH = 64  # nesting of the body (the object itself is 1): OpenAI's own schemas need ~20, orjson writes 254

NUMBER_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


class ParseStage:
    async def __call__(self, ctx: RequestContext) -> Reply | None:
        body = decode_body(ctx.raw_body)
        if ctx.wire is not None:  # Responses, Anthropic Messages: their fields checked, as a chat body
            body = ctx.wire.to_chat(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
        if ctx.endpoint == "chat":
            _check_messages(body.get("messages"))
        elif ctx.endpoint == "completions":
            _check_prompt(body.get("prompt"))
        else:
            embeddings.check_body(body)
        ctx.stream = _optional(body, "stream", bool) or False
        ctx.client_wants_usage = _stream_usage(body, ctx.stream)
        ctx.max_tokens = _max_tokens(body)
        _check_sampling(body)
        ctx.body = body
        ctx.model_requested = model
        ctx.reading = read(ctx.endpoint, body)
        return None


def decode_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not."""
    if not raw:
        raise InvalidRequest("the request body is empty; send a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise InvalidRequest(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    check_depth(raw, body)
    return body


def check_depth(raw: bytes, body: dict[str, Any]) -> None:
    """400 naming the top-level field of `body` (decoded from `raw`) that nests deeper than MAX_DEPTH."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:  # it cannot be that deep: most bodies stop here
        return
    for name, value in body.items():
        if _deeper_than(value, MAX_DEPTH - 1):
            raise InvalidRequest(f"'{name}' is nested deeper than the limit of {MAX_DEPTH} levels", param=name,
                                 code="too_deeply_nested")


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests arrays and objects more than `limit` deep (a scalar is 0, [] is 1), level by level."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [child for node in level for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, (dict, list))]
        if not level:
            return False
    return bool(level)


def _optional(body: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InvalidRequest(f"'{name}' must be of type {names}, got {type(value).__name__}", param=name)
    return value


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' is required and must be a non-empty array", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequest(f"'messages' holds more than {MAX_MESSAGES} messages", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a dict or list role is unhashable
            raise InvalidRequest(
                f"'messages[{i}].role' must be one of {', '.join(sorted(ROLES))}, got {role!r}",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if not (isinstance(content, (str, list)) or (content is None and role == "assistant")):
            raise InvalidRequest(
                f"'messages[{i}].content' must be a string or an array of content parts",
                param=f"messages[{i}].content",
            )


def _check_prompt(prompt: Any) -> None:
    ok = isinstance(prompt, str) or (
        isinstance(prompt, list)
        and bool(prompt)
        and (
            all(isinstance(p, str) for p in prompt)
            or _token_ids(prompt)
            or all(isinstance(p, list) and p and _token_ids(p) for p in prompt)
        )
    )
    if not ok:
        raise InvalidRequest(
            "'prompt' is required: a string, an array of strings, or an array of token ids", param="prompt"
        )
    if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) and len(prompt) > MAX_PROMPTS:
        raise InvalidRequest(f"'prompt' holds more than {MAX_PROMPTS} prompts", param="prompt")


def _token_ids(values: list[Any]) -> bool:
    return all(type(t) is int and 0 <= t < 1 << 31 for t in values)


def _stream_usage(body: dict[str, Any], stream: bool) -> bool:
    options = _optional(body, "stream_options", dict)
    if options is None:
        return False
    if not stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise InvalidRequest("'stream_options.include_usage' must be a boolean", param="stream_options.include_usage")
    return include


def _max_tokens(body: dict[str, Any]) -> int | None:
    found: int | None = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = _optional(body, name, int)
        if value is None:
            continue
        if value < 1:
            raise InvalidRequest(f"'{name}' must be at least 1, got {value}", param=name)
        if value > MAX_TOKENS_CEILING:
            raise InvalidRequest(f"'{name}' of {value} is beyond any model's context window", param=name)
        found = value if found is None else min(found, value)
    return found


SAMPLING_FIELDS = frozenset({*NUMBER_RANGES, "n", "best_of", "seed", "stop"})


def _check_sampling(body: dict[str, Any]) -> None:
    if body.keys().isdisjoint(SAMPLING_FIELDS):
        return  # the common request: none of them set
    for name, (low, high) in NUMBER_RANGES.items():
        value = _optional(body, name, (int, float))
        if value is not None and not low <= value <= high:
            raise InvalidRequest(f"'{name}' must be between {low:g} and {high:g}, got {value}", param=name)
    n = _optional(body, "n", int)
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise InvalidRequest(f"'n' must be between 1 and {MAX_CHOICES}, got {n}", param="n")
    best_of = _optional(body, "best_of", int)
    if best_of is not None and not (n or 1) <= best_of <= MAX_CHOICES:
        raise InvalidRequest(f"'best_of' must be between 'n' ({n or 1}) and {MAX_CHOICES}, got {best_of}",
                             param="best_of")
    _optional(body, "seed", int)
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop))
    ):
        raise InvalidRequest("'stop' must be a string or an array of at most 4 strings", param="stop")
