"""DifficultyClassifier and CachedEmbedder: LRU -> shared store -> encoder, determinism, load checks."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.difficulty import (
    DifficultyClassifier,
    EncoderMismatch,
    file_sha256,
    load_classifier,
    sentence_embedder,
)
from gateway.classifier.embedder import OFFLINE_SCOPE, CachedEmbedder, LazyEncoder
from gateway.classifier.embedding_cache import cache_key, scoped_key
from gateway.classifier.encoder import DIFFICULTY, SENTENCE, EncoderSession, default_model_path
from gateway.classifier.head import FEATURES, HeadSession
from gateway.training.fit import build_head_onnx

Vec = npt.NDArray[np.float32]
RNG = np.random.default_rng(3)
W, B = RNG.normal(0, 1, FEATURES), -0.2


def fake_embedding(text: str) -> Vec:
    seed = int(cache_key(text)[:8], 16)
    v = np.random.default_rng(seed).normal(0, 1, 384).astype(np.float32)
    return v / np.linalg.norm(v)


def expected_score(embedding: Vec, text: str) -> float:
    x = np.r_[embedding.astype(np.float64), math.log1p(len(text))]
    return float(1 / (1 + np.exp(-(x @ W + B))))


class FakeEncoder:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> Vec:
        self.texts.extend(texts)
        return np.stack([fake_embedding(t) for t in texts])


class FakeStore:
    """In-memory stand-in for gateway.cache.embeddings.EmbeddingStore; can fail or forget."""

    def __init__(self, fail: bool = False, forget: bool = False, garbage: bool = False) -> None:
        self.data: dict[str, Vec] = {}
        self.gets: list[str] = []
        self.fail, self.forget, self.garbage = fail, forget, garbage

    async def get_many(self, keys: Sequence[str]) -> list[Vec | None]:
        self.gets.extend(keys)
        if self.fail:
            raise ConnectionError("redis down")
        if self.garbage:  # e.g. a vector of another encoder's width
            return [np.ones(768, dtype=np.float32) for _ in keys]
        return [None if self.forget else self.data.get(k) for k in keys]

    async def put_many(self, items: Sequence[tuple[str, Vec]]) -> None:
        if self.fail:
            raise ConnectionError("redis down")
        self.data.update((k, np.array(v)) for k, v in items)


@pytest.fixture
def head_path(tmp_path: Path) -> Path:
    path = tmp_path / "head.onnx"
    path.write_bytes(build_head_onnx(W, B, np.zeros(FEATURES), np.ones(FEATURES)))
    return path


def classifier(head_path: Path, store: FakeStore | None = None) -> tuple[DifficultyClassifier, FakeEncoder]:
    encoder = FakeEncoder()
    embedder = CachedEmbedder(MicroBatcher(encoder, window_s=0.001), namespace="ns", store=store)
    return DifficultyClassifier(embedder, HeadSession(head_path)), encoder


async def test_scores_are_deterministic_and_equal_the_head_on_the_embedding(head_path: Path) -> None:
    texts = ["hi", "Prove Fermat's little theorem.", "hi  "]
    first, encoder = classifier(head_path)
    scores = [await first.score(t) for t in texts]
    second, _ = classifier(head_path)
    assert scores == [await second.score(t) for t in texts] == [await first.score(t) for t in texts]
    for text, score in zip(texts[:2], scores, strict=False):
        assert score == pytest.approx(expected_score(fake_embedding(text), text), abs=1e-6)
    assert encoder.texts == texts[:2]  # "hi  " normalizes to "hi": an LRU hit, as are the repeats
    first.close()
    second.close()


async def test_a_store_hit_skips_the_encoder(head_path: Path) -> None:
    store = FakeStore()
    stored = fake_embedding("something else entirely")
    store.data["ns:" + scoped_key(OFFLINE_SCOPE, "what is 2+2?")] = stored
    clf, encoder = classifier(head_path, store)
    score = await clf.score("what is 2+2?")
    assert encoder.texts == [] and clf.embedder.store_hits == 1
    assert score == pytest.approx(expected_score(stored, "what is 2+2?"), abs=1e-6)
    await clf.score("what is 2+2?")
    assert store.gets == ["ns:" + scoped_key(OFFLINE_SCOPE, "what is 2+2?")]  # the second call is an in-process LRU hit
    clf.close()


async def test_a_miss_encodes_and_writes_back_in_the_background(head_path: Path) -> None:
    store = FakeStore()
    clf, encoder = classifier(head_path, store)
    emb = await clf.embedder.embedding("translate 'chat' into English", scope=OFFLINE_SCOPE)
    await clf.embedder.drain()
    assert encoder.texts == ["translate 'chat' into English"] and clf.embedder.encoded == 1
    np.testing.assert_array_equal(store.data["ns:" + scoped_key(OFFLINE_SCOPE, "translate 'chat' into English")], emb)
    assert not emb.flags.writeable
    await clf.aclose()


@pytest.mark.parametrize(
    "store", [FakeStore(forget=True), FakeStore(fail=True), FakeStore(garbage=True)], ids=["none", "raises", "garbage"]
)
async def test_a_store_that_answers_none_garbage_or_fails_falls_back_to_the_encoder(head_path: Path, store: FakeStore) -> None:
    clf, encoder = classifier(head_path, store)
    score = await clf.score("hello")
    await clf.embedder.drain()
    assert encoder.texts == ["hello"] and clf.embedder.store_hits == 0
    assert score == pytest.approx(expected_score(fake_embedding("hello"), "hello"), abs=1e-6)
    clf.close()


def write_model(model_dir: Path, head_path: Path, sha: str, graph: str | None = "difficulty") -> None:
    model_dir.mkdir(exist_ok=True)
    (model_dir / "head.onnx").write_bytes(head_path.read_bytes())
    encoder = {"variant": "int8", "file": "difficulty.int8.onnx", "sha256": sha}
    if graph is None:  # metrics.json of a head from before encoder graphs existed
        encoder = {"variant": "int8", "file": "model.int8.onnx", "sha256": sha}
    else:
        encoder["graph"] = graph
    (model_dir / "metrics.json").write_text(json.dumps({"encoder": encoder, "compatible_encoders": {"int8": encoder}}))


async def test_load_classifier_checks_the_encoder_file(tmp_path: Path, head_path: Path) -> None:
    model_dir = tmp_path / "model"
    write_model(model_dir, head_path, file_sha256(default_model_path("int8", DIFFICULTY)))
    clf = load_classifier(model_dir, providers=["CPUExecutionProvider"])
    assert clf.provider == "CPUExecutionProvider" and clf.encoder_variant == "int8"
    assert clf.embedder.namespace.startswith("difficulty.int8.")
    score = await clf.score("Write a haiku about routers.")
    assert 0.0 <= score <= 1.0 and score == await clf.score("Write a haiku about routers.")
    clf.close()
    with pytest.raises(EncoderMismatch, match="not 'fp32'"):
        load_classifier(model_dir, encoder_variant="fp32", providers=["CPUExecutionProvider"])
    write_model(model_dir, head_path, "0" * 64)
    with pytest.raises(EncoderMismatch, match="sha256"):
        load_classifier(model_dir, providers=["CPUExecutionProvider"])
    with pytest.raises(FileNotFoundError, match="gateway train"):
        load_classifier(tmp_path / "nowhere")


def test_choose_variant_serves_only_compatible_encoders() -> None:
    from gateway.classifier.difficulty import choose_variant

    enc = {"variant": "int8", "sha256": "a" * 64}
    cuda = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    ok = {"encoder": enc, "compatible_encoders": {"int8": enc, "fp16": {"sha256": "b" * 64, "compatible": True}}}
    worse = {"encoder": enc, "compatible_encoders": {"int8": enc, "fp16": {"sha256": "b" * 64, "compatible": False}}}
    assert choose_variant(ok, None, cuda) == "fp16" and choose_variant(ok, None, cuda[1:]) == "int8"
    assert choose_variant(worse, None, cuda) == "int8"
    with pytest.raises(EncoderMismatch):
        choose_variant(worse, "fp16", cuda)


async def test_a_head_from_before_graphs_reads_the_sentence_encoder(tmp_path: Path, head_path: Path) -> None:
    write_model(tmp_path, head_path, file_sha256(default_model_path("int8", SENTENCE)), graph=None)
    clf = load_classifier(tmp_path, providers=["CPUExecutionProvider"])
    assert clf.embedder.namespace.startswith("model.int8.")
    clf.close()
    write_model(tmp_path, head_path, "0" * 64, graph="twelve-layers")
    with pytest.raises(EncoderMismatch, match="twelve-layers"):
        load_classifier(tmp_path, providers=["CPUExecutionProvider"])


def test_the_lazy_encoder_opens_once_on_first_use() -> None:
    opened: list[int] = []

    def open_session() -> EncoderSession:
        opened.append(1)
        return EncoderSession(default_model_path("int8", SENTENCE), providers=["CPUExecutionProvider"])

    lazy = LazyEncoder(open_session)
    assert lazy.session is None and opened == []
    first = lazy.embed(["hello"])
    assert lazy.embed(["hello"]).tolist() == first.tolist() and opened == [1]


async def test_the_semantic_embedder_is_the_sentence_graph_in_its_own_namespace(tmp_path: Path, head_path: Path) -> None:
    store = FakeStore()
    sentences = sentence_embedder("CPUExecutionProvider", store=store)
    write_model(tmp_path, head_path, file_sha256(default_model_path("int8", DIFFICULTY)))
    clf = load_classifier(tmp_path, providers=["CPUExecutionProvider"], store=store)
    text = "How do I sort a list in Python?"
    vector, features = (await sentences.embedding(text, scope=OFFLINE_SCOPE),
                        await clf.embedder.embedding(text, scope=OFFLINE_SCOPE))
    await sentences.drain()
    await clf.embedder.drain()
    reference = EncoderSession(default_model_path("int8", SENTENCE), providers=["CPUExecutionProvider"]).embed([text])[0]
    np.testing.assert_array_equal(vector, reference)
    assert float(vector @ features) < 0.99  # another graph, another vector
    assert sorted(k.split(":")[0].split(".")[0] for k in store.data) == ["difficulty", "model"]
    await sentences.aclose()
    await clf.aclose()
