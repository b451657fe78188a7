"""A GGUF model's tokenizer through llama.cpp's C API, vocabulary only: no weights, no context.

Loading the vocabulary alone leaves the model's hyperparameters unread (`n_ctx_train` 0), so it must never get
a context: llama-cpp-python's `Llama(vocab_only=True)` made one (512 tokens) and llama.cpp warned
`n_ctx_seq (512) > n_ctx_train (0)` on every `make run`. This talks to the vocabulary directly.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any


def tokenize(lc: Any, vocab: Any, text: str, add_bos: bool, special: bool) -> list[int]:
    """llama.cpp's token ids of `text`; `special` parses markers like <start_of_turn> as one token."""
    raw = text.encode("utf-8", errors="replace")
    size = len(raw) + 8
    buf = (lc.llama_token * size)()
    n = lc.llama_tokenize(vocab, raw, len(raw), buf, size, add_bos, special)
    if n < 0:
        size = -n
        buf = (lc.llama_token * size)()
        n = lc.llama_tokenize(vocab, raw, len(raw), buf, size, add_bos, special)
    return [int(t) for t in buf[:n]]


class GgufVocab:
    """The tokenizer and metadata of a GGUF file, read once (the file's vocabulary only)."""

    def __init__(self, path: Path) -> None:
        import llama_cpp as lc
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp's load chatter: errors only
        lc.llama_backend_init()
        params = lc.llama_model_default_params()
        params.vocab_only = True
        params.n_gpu_layers = 0
        self._lc = lc
        self._model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not read the vocabulary of {path}")
        self._vocab = lc.llama_model_get_vocab(self._model)

    def tokenize(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        return tokenize(self._lc, self._vocab, text, add_bos, special)

    def metadata(self, key: str) -> str | None:
        """A metadata value of the file as text (like `tokenizer.chat_template`), None when absent."""
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lc.llama_model_meta_val_str(self._model, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def __del__(self) -> None:
        model = getattr(self, "_model", None)
        if model:
            self._lc.llama_model_free(model)
