"""The llama.cpp tiers' token counter: the model's vocabulary only, and llama-server's `gemma` chat template."""

import pytest

from gateway.tokens import render_gemma

pytest.importorskip("llama_cpp")


def test_gemma_template_merges_the_system_text_into_the_first_user_turn_and_trims() -> None:
    messages = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi "},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": "Why?"}]}]
    assert render_gemma(messages) == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")


def test_the_counter_reads_the_vocabulary_without_a_context(capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 30: `Llama(vocab_only=True)` made a 512-token context for a model whose hyperparameters it had not
    read, and llama.cpp warned `n_ctx_seq (512) > n_ctx_train (0)` on every `make run`."""
    from gateway.tokens import TokenCounters

    counter = TokenCounters().for_spec("gguf:gemma3-270m-q4_k_m")
    assert counter.count("Hello world") == 2
    assert counter.count_prompt("chat", {"messages": [{"role": "user", "content": "Hello world"}]}) == 11
    assert counter.count_prompt("completions", {"prompt": "Hello world"}) == 3  # BOS + 2
    err = capfd.readouterr().err
    assert "n_ctx_train" not in err and "llama_context" not in err
