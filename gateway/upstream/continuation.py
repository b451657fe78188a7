"""Continuing a stream that broke after its first byte: the continuation request, and the splice.

    body = continuation_body("chat", original, text_so_far, max_tokens_left)  # to any replica
    scanner = ContinuationScanner(previous_scanner, prior_usage)              # its events, spliced

The continuation asks a backend to go on with the answer the client already has. Chat: the original
messages, then the text relayed so far as the start of the assistant's turn, with `continue_final_message:
true, add_generation_prompt: false` (vLLM's names; the emulator reads them too). llama.cpp's llama-server
reads the same fields but honours them only with a Jinja template: with a built-in one (`--no-jinja
--chat-template gemma`, as `gateway up` runs it) it closes the assistant's turn after the text. So a server
that renders its template on POST /apply-template gets the chat as that prompt plus the text so far, on
/completions (`template`), and its text_completion chunks are made chat chunks. Completions: the prompt
followed by the text so far. `max_tokens` (and `max_completion_tokens`) drop by the tokens already sent.
docs/FAULTS.md says what each backend does with it.

`ContinuationScanner` makes the continuation's events look like the rest of the first stream: the same id,
created and model, the role chunk that opens a chat stream dropped, the tally carried on (so the output cap,
the finish reason the relay adds, and the collected text count both parts), and the backend's usage chunk
made the client's: its prompt once, and every token it was sent (the earlier parts' too). A chat continued on
/completions keeps its `response_format`.
Nothing here runs on a stream that never broke.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.sse import SseScanner, StreamTally
from gateway.types import Endpoint

HEAD_FIELDS = ("id", "object", "created", "model")
# what a chat continued on /completions leaves out; response_format stays: what the client asked of the answer
CHAT_ONLY = frozenset({"messages", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
                       "logprobs", "top_logprobs", "continue_final_message", "add_generation_prompt",
                       "chat_template_kwargs", "reasoning_format", "max_completion_tokens"})


def continuation_body(endpoint: Endpoint, body: dict[str, Any], text: str, sent: int,
                      max_tokens: int | None, template: str | None = None) -> dict[str, Any]:
    """The request that continues `body`'s answer after `text` (what the client has: `sent` tokens), for
    `max_tokens` more. `template`: the chat's prompt as the backend's own chat template renders it (llama.cpp's
    POST /apply-template), for a chat continued on /completions (see the module docstring)."""
    if template is not None:
        out = {k: v for k, v in body.items() if k not in CHAT_ONLY}
        out["prompt"] = template + text
    elif endpoint == "chat":
        out = {**body, "messages": [*body["messages"], {"role": "assistant", "content": text}],
               "continue_final_message": True, "add_generation_prompt": False}
    else:
        out = {**body, "prompt": body["prompt"] + text}
        out.pop("echo", None)  # the prompt would come back: the client has it
    if isinstance(out.get("min_tokens"), int):  # vLLM's: counts the tokens this request generates
        out["min_tokens"] = max(0, out["min_tokens"] - sent)
    asked_as_completion = out.pop("max_completion_tokens", None) is not None
    out.pop("max_tokens", None)
    if max_tokens is not None:
        out["max_tokens"] = max_tokens  # llama.cpp's servers read only this one
        if asked_as_completion and template is None:
            out["max_completion_tokens"] = max_tokens
    return out


def not_resumable(endpoint: Endpoint, body: dict[str, Any]) -> str | None:
    """Why a request's stream may not be continued elsewhere (None: it may)."""
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return "n > 1"
    if endpoint == "chat" and body.get("tools") and body.get("tool_choice") != "none":
        return "the request offers tools (a tool call may be half sent)"
    if endpoint == "chat" and body.get("functions"):
        return "the request offers functions (a call may be half sent)"
    if endpoint == "completions" and not isinstance(body.get("prompt"), str):
        return "the prompt is not a single string"
    return None


class ContinuationScanner(SseScanner):
    """Reads a continuation's events as more of the stream `previous` scanned (see the module docstring).
    `sent` holds, for each part so far (this one last), the tokens the client had before it."""

    def __init__(self, previous: SseScanner, sent: tuple[int, ...], *, completions: bool = False) -> None:
        super().__init__(previous.endpoint, forward_usage=previous.forward_usage, limit=previous.limit)
        self.tally = previous.tally  # one tally for the whole answer
        self.tally.usage = None
        self._sent = sent
        self._head = previous.tally.head
        self._as_chat = completions and self._chat  # a chat continued on /completions: its chunks made chat ones

    def _tally_chunk(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        if self._as_chat:
            chunk["choices"] = [_chat_choice(c) for c in chunk.get("choices") or () if isinstance(c, dict)]
        chunk.update(self._head)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            chunk["usage"] = self._merged(usage)
        choices = chunk.get("choices")
        if choices and isinstance(choice := choices[0], dict) and self._chat:
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                del delta["role"]  # the client had the opening chunk from the first part
                if not delta.get("content") and not choice.get("finish_reason") and not delta.get("tool_calls") \
                        and not chunk.get("usage"):
                    return None
        return super()._tally_chunk(chunk, b"data: " + orjson.dumps(chunk))

    def _merged(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The client's usage from this part's: its request's (the original prompt P once: this part read P plus
        the k_last tokens sent before it) and every token it was sent (those before this part, and this part's).
        The work done, every part's prompt, is the log line's (`gateway.upstream.resume.ResumedSink`)."""
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return usage
        sent = self._sent
        prompt = max(prompt - sent[-1], 0)
        completion += sent[-1]
        merged = {**usage, "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(cached := details.get("cached_tokens"), int) and cached > prompt:
            merged["prompt_tokens_details"] = {**details, "cached_tokens": prompt}  # of the client's prompt
        return merged


def _chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A text_completion chunk's choice as a chat.completion.chunk's."""
    text = choice.get("text")
    return {"index": choice.get("index", 0), "delta": {"content": text} if text else {}, "logprobs": None,
            "finish_reason": choice.get("finish_reason")}
