"""Validate an OpenAI chat/completions body into a `GenRequest` (once, at the edge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from .tokens import stable_hash, tokenize

Kind = Literal["chat", "completion"]


class BadRequest(ValueError):
    """An invalid request body; answered with HTTP 400 and an OpenAI error."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class GenRequest:
    """What the emulator needs from a request."""

    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    prompt: list[str] | list[int]  # prompt tokens (regex pieces or given token ids)
    prompt_hash: int
    max_tokens: int | None
    ignore_eos: bool
    min_tokens: int
    seed: int | None
    prefill: str | None = None  # continue_final_message: the start of the answer (the last assistant message)
    base_tokens: int = 0  # ... and the prompt's tokens before it


def render_chat(messages: Any) -> str:
    """Flatten chat messages with a Llama-3-like template (its tags count as tokens)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a string role", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise BadRequest("message content must be a string or an array of parts", "messages")
        parts.append(f"<|{m['role']}|>\n{content}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _prefill(body: dict[str, Any], messages: Any) -> str | None:
    """With vLLM's `continue_final_message: true` (and `add_generation_prompt: false`, as vLLM requires), the
    last message, an assistant's, is the start of the answer to continue; None without it."""
    if body.get("continue_final_message") is not True:
        return None
    if body.get("add_generation_prompt", True) is not False:
        raise BadRequest("continue_final_message and add_generation_prompt cannot both be true", "add_generation_prompt")
    last = messages[-1] if isinstance(messages, list) and len(messages) > 1 else None
    if not isinstance(last, dict) or last.get("role") != "assistant" or not isinstance(last.get("content"), str):
        raise BadRequest("continue_final_message needs a last message from the assistant, with text content, "
                         "after the conversation", "messages")
    return str(last["content"])


def _prompt_tokens(prompt: Any) -> tuple[list[str] | list[int], int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return tokenize(prompt), stable_hash(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt), stable_hash(prompt)
    raise BadRequest("prompt must be a string or an array of token ids (batches are not supported)", "prompt")


def _opt_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise BadRequest(f"{name} must be an integer >= {minimum}", name)
    return v


def parse_body(raw: bytes, kind: Kind) -> GenRequest:
    """Parse and validate; raises BadRequest."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model must be a non-empty string", "model")
    prefill, base_tokens = None, 0
    if kind == "chat":
        messages = body.get("messages")
        prefill = _prefill(body, messages)
        text = render_chat(messages[:-1] if prefill is not None and isinstance(messages, list) else messages)
        phash = stable_hash(text)
        base_tokens = len(tokenize(text))
        prompt: list[str] | list[int] = tokenize(text + prefill if prefill is not None else text)
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        prompt, phash = _prompt_tokens(body.get("prompt"))
        max_tokens = _opt_int(body, "max_tokens", 1)
    if (_opt_int(body, "n", 1) or 1) != 1:
        raise BadRequest("the emulator supports n=1 only", "n")
    opts = body.get("stream_options")
    stream = body.get("stream") is True
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer", "seed")
    return GenRequest(
        kind=kind, model=model, stream=stream,
        include_usage=stream and isinstance(opts, dict) and opts.get("include_usage") is True,
        prompt=prompt, prompt_hash=phash, max_tokens=max_tokens,
        ignore_eos=body.get("ignore_eos") is True, min_tokens=_opt_int(body, "min_tokens", 0) or 0,
        seed=seed, prefill=prefill, base_tokens=base_tokens,
    )
