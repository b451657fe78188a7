"""The request's reading: one typed record of what a request asks, made once at parse, for every protocol.

Caches, caps, limits and prices decide from the reading, never from the raw body, so a request shape that
one stage forgot (`n`, prompt lists, token ids, images, tools) cannot slip past another:

    inputs        every input the backend reads, as `Part`s: each message's text, each content part (an
                  image, audio or file by its reference: a data URL's bytes or a remote URL), token ids,
                  tool definitions, tool calls and their arguments, the response format
    outputs       how many answers come back (prompts x n); `generated`: how many the backend writes
                  (prompts x max(n, best_of))
    ceiling       the output ceiling per answer (after the tenant's policy: `limit`)
    params        every other field that changes an answer (temperature, seed, stop, logit_bias, ...)

Sizes, for the tenant's prompt caps (`max_prompt_chars`, `max_prompt_tokens`):
    input_chars   characters of all text, tool definitions and arguments, plus the length of each media
                  reference (a 100 kB data URL counts 100 kB) and CHARS_PER_TOKEN per token id
    input_tokens  an estimate: text and tool characters / CHARS_PER_TOKEN + token ids + MEDIA_TOKENS per
                  media part (what a vision model spends on a 1024 x 1024 image, OpenAI's high detail)

Where a paraphrase may share an answer (the semantic cache): only when the reading ends in one user turn of
plain text (chat) or is one string prompt (completions); `semantic_text` is that text and `context_key`
digests everything else (earlier turns, system, tools, media, params). Anything else has no semantic text:
exact lookups only. A request whose only message is an assistant turn has none either.
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any, Literal, NamedTuple

import orjson

from gateway.types import Endpoint

CHARS_PER_TOKEN = 4
MEDIA_TOKENS = 765
# Fields that do not change the answer, and fields read as inputs: neither is a parameter.
OUTPUT_NEUTRAL = frozenset({"model", "stream", "stream_options", "user", "metadata", "store", "service_tier"})
INPUT_FIELDS = frozenset({"messages", "prompt", "input", "tools", "functions", "response_format"})
CEILING_FIELDS = frozenset({"max_tokens", "max_completion_tokens"})
NOT_PARAMS = OUTPUT_NEUTRAL | INPUT_FIELDS | CEILING_FIELDS | {"n", "best_of"}  # outputs are read on their own
TOOL_FIELDS = frozenset({"tools", "functions", "response_format"})
# Parameters whose answers one stored text cannot replay faithfully (tool definitions neither: `Reading.cache_class`).
UNREPLAYABLE = ("logprobs", "top_logprobs", "echo")

PartKind = Literal["text", "media", "token_ids", "tool", "tool_call"]
CacheClass = Literal["never", "deterministic", "always"]
MEDIA_TYPES = {"image_url": "url", "input_image": "image_url", "input_audio": "data", "file": "file_data"}


class Part(NamedTuple):
    """One input the backend reads: its kind, whose it is (a message's role, 'prompt', 'tools'), its value
    (text; a media reference; token ids; a tool definition or call as JSON) and the message or prompt it is in
    (two turns are not one turn of two parts)."""

    kind: PartKind
    role: str
    value: Any
    turn: int = 0


_part = partial(tuple.__new__, Part)  # Part((kind, role, value, turn)) without its Python-level __new__ (per turn)


class Reading:
    """What a request asks (the module docstring); built by `read`, limited by the policy stage (`limit`)."""

    __slots__ = ("endpoint", "parts", "prompts", "n", "best_of", "outputs", "generated", "params", "stop", "ceiling",
                 "input_chars", "input_tokens", "media_parts", "semantic_text", "cache_class", "_context_key", "_key")

    def __init__(self, endpoint: Endpoint, parts: tuple[Part, ...], prompts: int, n: int, best_of: int,
                 params: dict[str, Any], semantic_text: str | None) -> None:
        self.endpoint = endpoint
        self.parts = parts
        self.prompts = prompts
        self.n = n
        self.best_of = best_of
        self.outputs = prompts * n  # answers the client gets back
        self.generated = generated = prompts * max(n, best_of)  # answers the backend writes
        self.params = params  # answer-changing fields other than inputs, stop and the ceiling
        self.stop: tuple[str, ...] = _stops(params.pop("stop")) if "stop" in params else ()
        self.ceiling: int | None = None  # per answer: set by `limit`
        self.semantic_text = semantic_text
        text = media = ids = media_parts = 0
        tools = False
        for kind, role, value, _ in parts:
            if kind == "media":
                media += len(value)
                media_parts += 1
            elif kind == "token_ids":
                ids += len(value)
            else:
                text += len(value)
                tools = tools or role == "tools"
        self.input_chars = text + media + ids * CHARS_PER_TOKEN
        self.input_tokens = -(-text // CHARS_PER_TOKEN) + ids + media_parts * MEDIA_TOKENS
        self.media_parts = media_parts
        # Which cache modes would store this reading's answer, for a tenant with caching on
        # (`gateway.cache.keys.uncached_reasons` says why): 'never' (an embedding, or one stored text is not the
        # whole answer: more than one output, tools, log-probabilities), 'deterministic' (in either mode),
        # 'always' (only in mode 'always'). The cache stage and the log line both read it.
        self.cache_class: CacheClass
        if endpoint == "embeddings" or generated != 1 or tools or (
                not params.keys().isdisjoint(UNREPLAYABLE) and _unreplayable(params)):
            self.cache_class = "never"
        else:
            self.cache_class = "deterministic" if deterministic(params) else "always"
        self._context_key: str | None = None
        self._key: str | None = None

    def output_tokens_max(self) -> int:
        """The most output tokens the backend may write for this request (0 while the ceiling is unknown, and
        for embeddings, whose outputs are vectors)."""
        return 0 if self.endpoint == "embeddings" else self.generated * (self.ceiling or 0)

    def charge(self) -> int:
        """Tokens a rate limit charges on admission: all input and every output at its ceiling
        (`output_tokens_max`)."""
        return self.input_tokens + (0 if self.endpoint == "embeddings" else self.generated * (self.ceiling or 0))

    def limit(self, ceiling: int, stop: tuple[str, ...]) -> None:
        """The policy's ceiling per answer and the stop sequences after the tenant's own are merged."""
        self.ceiling, self.stop = ceiling, stop
        self._context_key = self._key = None

    def key(self) -> str:
        """A digest of the whole reading: equal for two requests exactly when every input and parameter is."""
        if self._key is None:
            self._key = self._digest(self.parts)
        return self._key

    def context_key(self) -> str:
        """A digest of everything but `semantic_text` (the last part, when there is one)."""
        if self._context_key is None:
            self._context_key = self._digest(self.parts[:-1] if self.semantic_text is not None else self.parts)
        return self._context_key

    def _digest(self, parts: tuple[Part, ...]) -> str:
        """blake2b-256 of the fields that change an answer and `parts` (each as a plain tuple: orjson writes
        tuples, not their subclasses); blake2b, not sha256: half the instructions on a CPU without SHA extensions."""
        fields = [self.endpoint, self.n, self.best_of, self.ceiling, list(self.stop), self.params]
        return hashlib.blake2b(orjson.dumps([fields, parts], default=tuple, option=orjson.OPT_SORT_KEYS),
                               digest_size=32).hexdigest()


def deterministic(params: dict[str, Any]) -> bool:
    """Temperature 0 or an integer seed: what cache mode 'deterministic' caches."""
    seed = params.get("seed")
    return params.get("temperature") == 0 or (isinstance(seed, int) and not isinstance(seed, bool))


def _unreplayable(params: dict[str, Any]) -> bool:
    for name in UNREPLAYABLE:
        if params.get(name):
            return True
    return False


def read(endpoint: Endpoint, body: dict[str, Any]) -> Reading:
    """The reading of a body that parse validated (chat, completions or embeddings; other protocols arrive
    translated to chat)."""
    params = {}
    for name, value in body.items():  # (a loop: a comprehension is one more call per request)
        if name not in NOT_PARAMS:
            params[name] = value
    n = body.get("n") or 1
    best_of = body.get("best_of") or 1
    extra = [] if body.keys().isdisjoint(TOOL_FIELDS) else _tool_parts(body)
    if endpoint == "chat":
        parts, semantic = _chat_parts(body.get("messages") or [])
        return Reading(endpoint, (*extra, *parts), 1, n, best_of, params, semantic)
    prompts = body.get("prompt" if endpoint == "completions" else "input")
    parts, count = _prompt_parts(prompts)
    semantic = prompts if isinstance(prompts, str) else None
    if endpoint == "embeddings":
        return Reading(endpoint, tuple(parts), count, 1, 1, params, None)
    return Reading(endpoint, (*extra, *parts), count, n, best_of, params, semantic)


def _chat_parts(messages: list[dict[str, Any]]) -> tuple[list[Part], str | None]:
    parts: list[Part] = []
    for turn, message in enumerate(messages):
        role = message["role"]
        content = message.get("content")
        if len(message) == 2 and isinstance(content, str):  # the common turn: a role and its text
            parts.append(_part(("text", role, content, turn)))
            continue
        if message.get("name") is not None or message.get("tool_call_id") is not None:
            parts.append(Part("text", role, f"{message.get('name') or ''}\x00{message.get('tool_call_id') or ''}",
                              turn))
        if isinstance(content, str):
            parts.append(Part("text", role, content, turn))
        elif isinstance(content, list):
            parts.extend(_content_part(role, item, turn) for item in content)
        for call in (message.get("tool_calls") or ()):
            parts.append(Part("tool_call", role, _json(call), turn))
        if message.get("function_call") is not None:
            parts.append(Part("tool_call", role, _json(message["function_call"]), turn))
    semantic = None
    if parts:
        last, final = messages[-1], parts[-1]
        if last["role"] == "user" and final.role == "user" and final.kind == "text" and (
                len(last) == 2 and isinstance(last.get("content"), str) or _plain_user_turn(last)):
            semantic = final.value
    return parts, semantic


def _plain_user_turn(message: dict[str, Any]) -> bool:
    """One user message of text only (a string, or one text part), no name."""
    content = message.get("content")
    if isinstance(content, str):
        return message.get("name") is None
    if message.get("name") is not None:
        return False
    return isinstance(content, list) and len(content) == 1 and _is_text(content[0])


def _is_text(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") in ("text", "input_text", None) \
        and isinstance(item.get("text"), str)


def _content_part(role: str, item: Any, turn: int) -> Part:
    """A content part: its text, a media part by its reference (data URL bytes or remote URL), else as JSON."""
    if _is_text(item):
        return Part("text", role, item["text"], turn)
    if isinstance(item, dict):
        kind = item.get("type")
        inner = item.get(kind) if isinstance(kind, str) else None
        field = MEDIA_TYPES.get(kind) if isinstance(kind, str) else None
        if field is not None:
            ref = inner.get(field) if isinstance(inner, dict) else inner
            detail = inner.get("detail") if isinstance(inner, dict) else None
            if isinstance(ref, str):
                return Part("media", role, ref if detail is None else f"{detail}\x00{ref}", turn)
        if kind == "refusal" and isinstance(item.get("refusal"), str):
            return Part("text", role, item["refusal"], turn)
    return Part("media", role, _json(item), turn)  # unknown parts count whole, as media: never ignored


def _prompt_parts(prompt: Any) -> tuple[list[Part], int]:
    """Completion prompts or embedding inputs: one part per prompt; how many prompts."""
    if isinstance(prompt, str):
        return [Part("text", "prompt", prompt)], 1
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [Part("token_ids", "prompt", tuple(prompt))], 1
    parts = [Part("text", "prompt", p, i) if isinstance(p, str) else Part("token_ids", "prompt", tuple(p), i)
             for i, p in enumerate(prompt or ())]
    return parts, max(len(parts), 1)


def _tool_parts(body: dict[str, Any]) -> list[Part]:
    """Tool and function definitions and the response format: the backend reads them as input."""
    found = []
    for name in ("tools", "functions"):
        value = body.get(name)
        if value:
            found.append(Part("tool", "tools", _json(value)))
    if body.get("response_format") is not None:
        found.append(Part("tool", "response_format", _json(body["response_format"])))
    return found


def _stops(stop: Any) -> tuple[str, ...]:
    if isinstance(stop, str):
        return (stop,)
    return tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else ()


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
