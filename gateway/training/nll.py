"""The small tier's surprise at a reference answer: mean per-token NLL under Gemma 3 270M via llama.cpp.

The example uses the served chat template (`--chat_format gemma`):

    <bos><start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n{answer}

Prompt capped to PROMPT_CAP tokens (head and tail kept), answer to ANSWER_CAP tokens. Logits are
requested only at the positions that predict answer tokens (Gemma's vocabulary has 262k
entries, so the LM head dominates otherwise); log-softmax is a float64 logsumexp in numpy.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

PROMPT_CAP = 512
ANSWER_CAP = 128
USER_OPEN = "<start_of_turn>user\n"
MODEL_OPEN = "<end_of_turn>\n<start_of_turn>model\n"


def cap_head_tail(tokens: Sequence[int], cap: int) -> list[int]:
    """At most `cap` tokens: the first ceil(cap/2) and the last floor(cap/2) when too long."""
    if len(tokens) <= cap:
        return list(tokens)
    head = (cap + 1) // 2
    tail = cap - head
    return list(tokens[:head]) + (list(tokens[len(tokens) - tail :]) if tail else [])


def mean_nll(logits: npt.NDArray[np.float32], targets: Sequence[int], rows: int = 4) -> float:
    """Mean of -log softmax(logits[j])[targets[j]]: float64 logsumexp, `rows` rows at a time in place."""
    total = 0.0
    buf = np.empty((min(rows, len(targets)), logits.shape[1]), dtype=np.float64)
    for start in range(0, len(targets), rows):
        block = logits[start : start + rows]
        out = buf[: block.shape[0]]
        np.copyto(out, block)
        peak = out.max(axis=1, keepdims=True)
        np.subtract(out, peak, out=out)
        np.exp(out, out=out)
        lse = peak[:, 0] + np.log(out.sum(axis=1))
        picked = block[np.arange(block.shape[0]), np.asarray(targets[start : start + rows])]
        total += float((lse - picked.astype(np.float64)).sum())
    return total / len(targets)


@dataclass(frozen=True, slots=True)
class Example:
    """Token ids of one formatted example; answer tokens start at `answer_start`."""

    tokens: list[int]
    answer_start: int
    prompt_tokens: int  # before capping
    answer_tokens_full: int  # before capping


class NllScorer:
    """Gemma via llama.cpp's low-level API: one context, logits only where answer tokens are predicted."""

    def __init__(self, model_path: Path, n_threads: int = 1, n_ctx: int = 1024) -> None:
        import llama_cpp as lc

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter
        self._lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the served tier (Llama's default)
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = n_ctx
        self.bos = int(lc.llama_vocab_bos(self._vocab))
        self._batch = lc.llama_batch_init(n_ctx, 0, 1)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`, no BOS; `special` parses markers like <start_of_turn>."""
        from gateway.local.vocab import tokenize

        return tokenize(self._lc, self._vocab, text, add_bos=False, special=special)

    def example(
        self, prompt: str, answer: str, prompt_cap: int = PROMPT_CAP, answer_cap: int = ANSWER_CAP
    ) -> Example:
        """BOS + Gemma chat template around the capped prompt, then the capped answer."""
        p = self.tokenize(prompt)
        a = self.tokenize(answer)
        user, model = self.tokenize(USER_OPEN, special=True), self.tokenize(MODEL_OPEN, special=True)
        head = [self.bos, *user, *cap_head_tail(p, prompt_cap), *model]
        return Example(head + a[:answer_cap], len(head), len(p), len(a))

    def nll(self, ex: Example) -> float:
        """Mean NLL of ex.tokens[answer_start:] given everything before, one decode call."""
        lc, batch, n = self._lc, self._batch, len(ex.tokens)
        if not 0 < ex.answer_start < n <= self.n_ctx:
            raise ValueError(f"example of {n} tokens does not fit n_ctx={self.n_ctx}")
        lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)
        batch.n_tokens = n
        for i, tok in enumerate(ex.tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if ex.answer_start - 1 <= i < n - 1 else 0
        if (code := lc.llama_decode(self._ctx, batch)) != 0:
            raise RuntimeError(f"llama_decode failed with code {code}")
        targets = ex.tokens[ex.answer_start :]
        logits = np.empty((len(targets), self.n_vocab), dtype=np.float32)
        for j in range(len(targets)):
            ptr = lc.llama_get_logits_ith(self._ctx, ex.answer_start - 1 + j)
            row = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
            logits[j] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
        return mean_nll(logits, targets)

    def close(self) -> None:
        """Free the batch, context and model."""
        self._lc.llama_batch_free(self._batch)
        self._lc.llama_free(self._ctx)
        self._lc.llama_model_free(self._model)
