"""The held-out designs of gateway.training.router_eval on synthetic outcomes (no encoder): what each reports."""

import numpy as np
import pytest

from gateway.classifier.encoder import EMBEDDING_DIM
from gateway.classifier.prompt_features import feature_matrix
from gateway.training.outcomes import OutcomeRow, hash_split
from gateway.training.router_data import OutcomeSet, target_matrix
from gateway.training.router_eval import PAIRS, Context, hash_design, loso_design, loto_design

RNG = np.random.default_rng(5)
DC = [p for p in PAIRS if p.source == PAIRS[0].source]


def synthetic() -> OutcomeSet:
    """Three sources; on dcrouter the strong models gain on task "code" only, and lose on "trivia"."""
    rows, embeddings = [], []
    centre = {t: RNG.normal(size=EMBEDDING_DIM) for t in ("code", "chat", "trivia", "open", "arena")}
    for i in range(900):
        pair = PAIRS[[0, 0, 0, 2, 3][i % 5]]
        task = {0: ["code", "chat", "trivia"][i % 3], 2: "open", 3: "arena"}[[0, 0, 0, 2, 3][i % 5]]
        weak = float(RNG.random() < (0.2 if task == "code" else 0.6))
        strong = float(RNG.random() < (0.9 if task == "code" else 0.3 if task == "trivia" else 0.6))
        scores = {pair.weak: weak, pair.strong: strong}
        if pair.source == PAIRS[0].source:
            scores[PAIRS[1].strong] = strong
        prompt = f"{task} prompt number {i}"
        rows.append(OutcomeRow(f"r{i}", pair.source, task, prompt, scores, None, hash_split(prompt)))
        vector = centre[task] + RNG.normal(scale=0.5, size=EMBEDDING_DIM)
        embeddings.append(vector / np.linalg.norm(vector))
    models, targets = target_matrix(rows)
    texts = [r.prompt for r in rows]
    return OutcomeSet(rows, models, targets, np.array(embeddings, dtype=np.float32), feature_matrix(texts))


@pytest.fixture(scope="module")
def ctx() -> Context:
    data = synthetic()
    return Context(data, RNG.random(len(data.rows)), 0.5, 3.0, 1.0)


def test_the_hash_split_reports_every_router_with_intervals(ctx: Context) -> None:
    result = hash_design(ctx, rounds=30)
    dc = result[PAIRS[0].name]
    assert set(dc["routers"]) == {"random", "length", "rubric", "knn", "linear", "router", "oracle"}
    assert dc["routers"]["linear"]["apgr"][0] > 0.6  # the task is in the embedding
    low, high = dc["routers"]["random"]["apgr"][1:]
    assert low < 0.5 < high
    assert set(dc["router_minus"]) == {"length", "knn", "rubric"}


def test_leave_one_task_out_skips_a_task_where_the_strong_model_loses(ctx: Context) -> None:
    result = loto_design(ctx, tuple(DC), rounds=20)
    trivia = result[PAIRS[0].name]["trivia"]
    assert "skipped" in trivia and "does not beat" in trivia["skipped"]
    assert "routers" in result[PAIRS[0].name]["code"]


def test_leave_one_source_out_scores_a_source_by_the_others(ctx: Context) -> None:
    result = loso_design(ctx, rounds=20)
    assert set(result) == {PAIRS[0].name, PAIRS[2].name, PAIRS[3].name}
    assert PAIRS[0].name not in result[PAIRS[0].name]["scored_by"]
