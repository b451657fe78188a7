"""Prompt tokenizer for the classifier encoder: BERT WordPiece, head + tail truncation.

A prompt longer than the budget keeps its first and last tokens ([CLS] head tail [SEP]), so the
encoder's cost is bounded. Long texts are tokenized only near their ends (a window of characters
grown until the kept tokens are provably the same as in a full tokenization), so tokenizing a
megabyte prompt costs about as much as a short one.

`remember(text, ids)` hands ids already computed (by the cascade, on the event loop) to the next
`ids(text)` (the encoder's, in its thread), so a prompt the cascade sends on is not tokenized twice.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

from gateway.tokens import default_tokenizer_path

Batch = dict[str, npt.NDArray[np.int64]]

_CHARS_PER_TOKEN = 6  # first window guess; it doubles until enough whole words fit
_MEMO_ENTRIES = 1024  # remembered ids not yet asked for (a prompt answered from a cache never is)


class PromptTokenizer:
    """Turns texts into padded int64 encoder inputs of at most `max_tokens` tokens each."""

    def __init__(self, max_tokens: int = 256, *, path: Path | None = None) -> None:
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
        self.max_tokens = max_tokens
        self._tok = Tokenizer.from_file(str(path or default_tokenizer_path()))
        self._tok.no_truncation()
        self._tok.no_padding()
        self._cls = self._special_id("[CLS]")
        self._sep = self._special_id("[SEP]")
        self._pad = self._special_id("[PAD]")
        budget = max_tokens - 2
        self._head = budget // 2
        self._tail = budget - self._head
        self._memo: dict[str, list[int]] = {}
        self._memo_lock = threading.Lock()

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (truncation and padding off)."""
        return self._tok

    def _special_id(self, token: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer has no {token} token")
        return int(token_id)

    def ids(self, text: str) -> list[int]:
        """Token ids of one text with [CLS]/[SEP], head + tail truncated to `max_tokens`."""
        if self._memo and (known := self._memo.pop(text, None)) is not None:
            return known
        return [self._cls, *self._body(text), self._sep]

    def remember(self, text: str, ids: list[int]) -> None:
        """Make the next `ids(text)` return `ids` (this tokenizer's own output for `text`) without tokenizing."""
        with self._memo_lock:
            self._memo[text] = ids
            while len(self._memo) > _MEMO_ENTRIES:
                try:
                    del self._memo[next(iter(self._memo))]  # the oldest
                except (KeyError, StopIteration, RuntimeError):  # taken meanwhile by ids() in another thread
                    break

    def encode_batch(self, texts: Sequence[str]) -> Batch:
        """input_ids, attention_mask, token_type_ids (int64, B x longest) for `texts`."""
        rows = [self.ids(text) for text in texts]
        width = max((len(row) for row in rows), default=2)
        input_ids = np.full((len(rows), width), self._pad, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}

    def _body(self, text: str) -> list[int]:
        budget = self._head + self._tail
        window = max(budget, 1) * _CHARS_PER_TOKEN
        while 2 * window < len(text):
            head = self._head_ids(text[:window])
            tail = self._tail_ids(text[-window:])
            if head is not None and tail is not None:
                return head + tail
            window *= 2
        ids: list[int] = self._encode(text).ids
        if len(ids) <= budget:
            return ids
        return ids[: self._head] + ids[len(ids) - self._tail :]

    def _encode(self, text: str) -> Encoding:
        return self._tok.encode(text, add_special_tokens=False)

    def _head_ids(self, chunk: str) -> list[int] | None:
        """First `head` ids, if they all lie in words that end before the chunk's (maybe cut) last word."""
        if self._head == 0:
            return []
        enc = self._encode(chunk)
        if len(enc.ids) <= self._head or not _before(enc.word_ids[self._head - 1], enc.word_ids[-1]):
            return None
        return list(enc.ids[: self._head])

    def _tail_ids(self, chunk: str) -> list[int] | None:
        """Last `tail` ids, if they all lie in words that begin after the chunk's (maybe cut) first word."""
        if self._tail == 0:
            return []
        enc = self._encode(chunk)
        if len(enc.ids) <= self._tail or not _before(enc.word_ids[0], enc.word_ids[-self._tail]):
            return None
        return list(enc.ids[-self._tail :])


def _before(word: int | None, other: int | None) -> bool:
    return word is not None and other is not None and word < other
