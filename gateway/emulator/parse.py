"""Validate an OpenAI chat/completions body into a `GenRequest` (once, at the edge).

What the emulator reads, as vLLM's OpenAI server does:

    completions   `prompt`: a string, a list of strings, a list of token ids or a list of token-id lists;
                  one choice per prompt x `n` (index = prompt_i * n + j); `best_of` (vLLM v0: generate
                  best_of per prompt, return the n best); `logprobs` (an int: top alternatives per token)
    chat          `messages` with string content or content parts (text; image_url, input_image,
                  input_audio, audio_url, video_url, file: MEDIA_TOKENS prompt tokens each, keyed by a digest of
                  their URL or bytes), `name`, `tool_calls` (and the legacy `function_call`), `tool_call_id`;
                  `tools` / `functions` rendered into the prompt as a chat template would; `n`; `logprobs` and
                  `top_logprobs`
    both          ANSWER_PARAMS (temperature, top_p, stop, logit_bias, response_format, ...) change the answer:
                  they are hashed into each prompt's hash, so a request differing in any of them gets another text

Every input the backend reads is in a prompt's tokens or its hash, so two requests that differ in any of them get
different answers, and the same request always gets the same one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .tokens import stable_hash, tokenize

Kind = Literal["chat", "completion"]

MAX_N = 128  # OpenAI's limit on `n` (and on `best_of` here)
MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI and vLLM's default max_logprobs
MEDIA_TOKENS = 765  # prompt tokens one media part costs (OpenAI's high-detail 1024 x 1024 image)
# content part type -> the field of its inner object holding the URL or bytes
MEDIA_FIELDS = {"image_url": "url", "input_image": "image_url", "input_audio": "data", "audio_url": "url",
                "video_url": "url", "file": "file_data"}
MEDIA_WORDS = {"image_url": "image", "input_image": "image", "input_audio": "audio", "audio_url": "audio",
               "video_url": "video", "file": "file"}
TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# Sampling and decoding fields that change an answer (not its length): hashed into the prompt's hash.
ANSWER_PARAMS = (
    "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "length_penalty", "logit_bias", "stop", "stop_token_ids", "bad_words", "allowed_token_ids", "response_format",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs", "tool_choice",
    "parallel_tool_calls", "function_call", "chat_template", "chat_template_kwargs", "reasoning_effort",
    "truncate_prompt_tokens", "include_stop_str_in_output", "skip_special_tokens", "echo", "suffix",
)

_ANSWER_SET = frozenset(ANSWER_PARAMS)


class BadRequest(ValueError):
    """An invalid request body; answered with HTTP 400 and an OpenAI error."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(slots=True)
class Prompt:
    """One prompt of a request: its tokens (regex pieces or given token ids) and the hash seeding its answers."""

    tokens: list[str] | list[int]
    hash: int


@dataclass(slots=True)
class GenRequest:
    """What the emulator needs from a request."""

    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    prompt: list[str] | list[int]  # the first prompt's tokens (regex pieces or given token ids)
    prompt_hash: int
    max_tokens: int | None
    ignore_eos: bool
    min_tokens: int
    seed: int | None
    prefill: str | None = None  # continue_final_message: the start of the answer (the last assistant message)
    base_tokens: int = 0  # ... and the prompt's tokens before it
    prompts: list[Prompt] = field(default_factory=list)  # every prompt, the first included
    n: int = 1  # choices returned per prompt
    best_of: int = 1  # sequences generated per prompt (>= n)
    logprobs: int | None = None  # None: no logprobs; else top alternatives per token (0: the chosen token's only)
    cache_salt: str | None = None  # vLLM >= 0.9: keys the prefix cache (a prefix is reused only under one salt)

    def __post_init__(self) -> None:
        if not self.prompts:
            self.prompts = [Prompt(self.prompt, self.prompt_hash)]

    @property
    def single(self) -> bool:
        """One prompt, one sequence: the plain path."""
        return len(self.prompts) == 1 and self.best_of == 1


def _digest(data: str) -> str:
    return hashlib.blake2b(data.encode(), digest_size=8).hexdigest()


def media_placeholder(kind: str, ref: str) -> str:
    """MEDIA_TOKENS tokens standing for one media part; its first token carries the digest of its reference."""
    return f"{kind}_{_digest(ref)}" + f" {kind}" * (MEDIA_TOKENS - 1)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _render_part(part: Any) -> str:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise BadRequest("each content part must be an object", "messages")
    kind = part.get("type")
    if kind is None and isinstance(part.get("text"), str) or kind in TEXT_PARTS:
        text = part.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"a {kind} part needs a string text", "messages")
        return text
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return str(part["refusal"])
    if isinstance(kind, str) and kind in MEDIA_FIELDS:
        inner = part.get(kind)
        if inner is None:  # the reference on the part itself (Responses' input_image: {"image_url": ...})
            inner = part
        ref = inner.get(MEDIA_FIELDS[kind]) if isinstance(inner, dict) else inner
        if kind == "input_audio" and isinstance(inner, dict) and isinstance(ref, str):
            ref = f"{inner.get('format')}:{ref}"
        elif kind == "file" and isinstance(inner, dict) and not isinstance(ref, str):
            ref = inner.get("file_id")
        if not isinstance(ref, str) or not ref:
            raise BadRequest(f"a {kind} part needs its {MEDIA_FIELDS[kind]}", "messages")
        detail = inner.get("detail") if isinstance(inner, dict) else None
        return media_placeholder(MEDIA_WORDS[kind], ref if detail is None else f"{detail}\x00{ref}")
    raise BadRequest(f"Unknown part type: {kind!r}", "messages")


def _render_content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        return " ".join(_render_part(p) for p in content)
    raise BadRequest("message content must be a string or an array of parts", "messages")


def _render_calls(m: dict[str, Any]) -> str:
    calls = m.get("tool_calls")
    out: list[str] = []
    if calls is not None:
        if not isinstance(calls, list):
            raise BadRequest("tool_calls must be an array", "messages")
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest("each tool call needs a function with a name", "messages")
            args = fn.get("arguments")
            out.append(f'<tool_call>{{"id": {_json(call.get("id"))}, "name": {_json(fn["name"])}, '
                       f'"arguments": {args if isinstance(args, str) else _json(args)}}}</tool_call>')
    legacy = m.get("function_call")
    if isinstance(legacy, dict):
        out.append(f"<tool_call>{_json(legacy)}</tool_call>")
    return "".join(out)


def render_tools(tools: Any) -> str:
    """Tool (or legacy function) definitions as a chat template puts them before the conversation."""
    if tools is None or tools == []:
        return ""
    if not isinstance(tools, list):
        raise BadRequest("tools must be an array", "tools")
    lines = "".join(_json(t) + "\n" for t in tools)
    return f"<|system|>\nYou can call these functions:\n{lines}"


def render_chat(messages: Any, tools: Any = None) -> str:
    """Flatten chat messages with a Llama-3-like template (its tags count as tokens): the tool definitions
    first, then each message's role, name, tool_call_id, content (media parts as MEDIA_TOKENS tokens each) and
    tool calls with their arguments."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    parts: list[str] = [render_tools(tools)]
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message must be an object with a string role", "messages")
        head = m["role"]
        name, call_id = m.get("name"), m.get("tool_call_id")
        if isinstance(name, str):
            head += f" name={name}"
        if isinstance(call_id, str):
            head += f" call={call_id}"
        parts.append(f"<|{head}|>\n{_render_content(m.get('content'))}{_render_calls(m)}\n")
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


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value)


def _one_prompt(prompt: Any, salt: str) -> Prompt:
    if isinstance(prompt, str):
        return Prompt(tokenize(prompt), salted(stable_hash(prompt), salt))
    if _is_ids(prompt):
        if min(prompt) < 0:
            raise BadRequest("token ids must be >= 0", "prompt")
        return Prompt(list(prompt), salted(stable_hash(prompt), salt))
    raise BadRequest("prompt must be a string, an array of strings, an array of token ids or an array of "
                     "token-id arrays", "prompt")


def _prompts(prompt: Any, salt: str) -> list[Prompt]:
    """vLLM's prompt forms: a string, token ids, or a non-empty list of either (a batch)."""
    if isinstance(prompt, str) or _is_ids(prompt):
        return [_one_prompt(prompt, salt)]
    if isinstance(prompt, list) and prompt:
        return [_one_prompt(p, salt) for p in prompt]
    raise BadRequest("prompt must be a string, an array of strings, an array of token ids or an array of "
                     "token-id arrays", "prompt")


def salted(prompt_hash: int, salt: str) -> int:
    """A prompt's hash with the request's answer-changing parameters mixed in (unchanged without any)."""
    return prompt_hash if not salt else stable_hash(f"{prompt_hash}\x00{salt}")


def answer_salt(body: dict[str, Any]) -> str:
    """The ANSWER_PARAMS a body sets, as canonical JSON ('' when it sets none)."""
    names = _ANSWER_SET.intersection(body)
    if not names:
        return ""
    given = {k: body[k] for k in names if body[k] is not None}
    return _json(given) if given else ""


def _opt_int(body: dict[str, Any], name: str, minimum: int, maximum: int | None = None) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum or (maximum is not None and v > maximum):
        bound = f" and <= {maximum}" if maximum is not None else ""
        raise BadRequest(f"{name} must be an integer >= {minimum}{bound}", name)
    return v


def _logprobs(body: dict[str, Any], kind: Kind) -> int | None:
    if kind == "completion":
        return _opt_int(body, "logprobs", 0, MAX_LOGPROBS)
    want = body.get("logprobs")
    if want is not None and not isinstance(want, bool):
        raise BadRequest("logprobs must be a boolean", "logprobs")
    top = _opt_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if top is not None and top > 0 and want is not True:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if want else None


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
    salt = answer_salt(body)
    prefill, base_tokens = None, 0
    if kind == "chat":
        messages = body.get("messages")
        prefill = _prefill(body, messages)
        tools = body.get("tools") if body.get("tools") is not None else body.get("functions")
        text = render_chat(messages[:-1] if prefill is not None and isinstance(messages, list) else messages, tools)
        base_tokens = len(tokenize(text))
        prompts = [Prompt(tokenize(text + prefill if prefill is not None else text), salted(stable_hash(text), salt))]
        max_tokens = _opt_int(body, "max_completion_tokens", 1)
        if max_tokens is None:
            max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        prompts = _prompts(body.get("prompt"), salt)
        max_tokens = _opt_int(body, "max_tokens", 1)
    n = _opt_int(body, "n", 1, MAX_N) or 1
    best_of = (_opt_int(body, "best_of", 1, MAX_N) if kind == "completion" else None) or n
    if best_of < n:
        raise BadRequest("best_of must be greater than or equal to n", "best_of")
    opts = body.get("stream_options")
    stream = body.get("stream") is True
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise BadRequest("seed must be an integer", "seed")
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise BadRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")  # vLLM's
    return GenRequest(
        kind=kind, model=model, stream=stream,
        include_usage=stream and isinstance(opts, dict) and opts.get("include_usage") is True,
        prompt=prompts[0].tokens, prompt_hash=prompts[0].hash, max_tokens=max_tokens,
        ignore_eos=body.get("ignore_eos") is True, min_tokens=_opt_int(body, "min_tokens", 0) or 0,
        seed=seed, prefill=prefill, base_tokens=base_tokens, prompts=prompts, n=n, best_of=best_of,
        logprobs=_logprobs(body, kind), cache_salt=cache_salt,
    )
