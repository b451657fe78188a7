"""Outcome rows as arrays for fitting and measuring: targets (n, M) with NaN where unmeasured, the embeddings
of the difficulty classifier's encoder (the ones the gateway already computes per prompt), cheap features.

    data = load_outcome_set(read_outcomes(paths), cache_dir=Path(".cache/router-embeddings"))

Embeddings are computed once per encoder file and token window and kept in `cache_dir` (an .npz keyed by
text hash; gateway.training.embedding.EmbeddingFile), never in the repository.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.classifier.difficulty import encoder_graph, file_sha256, max_tokens_of, read_metrics
from gateway.classifier.encoder import EncoderSession, default_model_path
from gateway.classifier.prompt_features import feature_matrix
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.embedding import EmbeddingFile
from gateway.training.outcomes import OutcomeRow

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]
ROOT = Path(__file__).resolve().parents[2]
DIFFICULTY_DIR = ROOT / "models" / "difficulty"


@dataclass(frozen=True, slots=True)
class OutcomeSet:
    rows: list[OutcomeRow]
    models: tuple[str, ...]
    targets: F64  # (n, M), NaN where the row's source did not measure the model
    embeddings: F32  # (n, 384)
    features: F32  # (n, prompt_features.COUNT)

    @property
    def x(self) -> F64:
        """What the linear router reads: embedding then cheap features."""
        return np.hstack([self.embeddings, self.features]).astype(np.float64)

    def column(self, model: str) -> F64:
        out: F64 = self.targets[:, self.models.index(model)]
        return out

    def subset(self, mask: npt.NDArray[np.bool_]) -> OutcomeSet:
        keep = np.flatnonzero(mask)
        return OutcomeSet([self.rows[i] for i in keep], self.models, self.targets[keep], self.embeddings[keep],
                          self.features[keep])


def encoder_of(difficulty_dir: Path = DIFFICULTY_DIR) -> dict[str, Any]:
    """The difficulty head's encoder record (graph, variant, sha256, max_tokens): the router reads the same."""
    metrics = read_metrics(difficulty_dir)
    enc = dict(metrics["encoder"])
    enc["max_tokens"] = max_tokens_of(metrics)
    enc["path"] = default_model_path(str(enc["variant"]), encoder_graph(metrics))
    if file_sha256(enc["path"]) != enc["sha256"]:
        raise ValueError(f"{enc['path']} is not the encoder file {difficulty_dir} records (sha256 differs)")
    return enc


def target_matrix(rows: Sequence[OutcomeRow], models: Sequence[str] | None = None) -> tuple[tuple[str, ...], F64]:
    names = tuple(models) if models is not None else tuple(sorted({m for r in rows for m in r.scores}))
    index = {m: i for i, m in enumerate(names)}
    out = np.full((len(rows), len(names)), np.nan)
    for i, row in enumerate(rows):
        for model, score in row.scores.items():
            if model in index:
                out[i, index[model]] = score
    return names, out


def load_outcome_set(
    rows: Sequence[OutcomeRow], *, cache_dir: Path | None = None, difficulty_dir: Path = DIFFICULTY_DIR, threads: int = 1,
) -> OutcomeSet:
    """Embed (through the on-disk cache) and featurize `rows`."""
    enc = encoder_of(difficulty_dir)
    session = EncoderSession(enc["path"], providers=["CPUExecutionProvider"], threads=threads,
                             tokenizer=PromptTokenizer(enc["max_tokens"]))
    texts = [r.prompt for r in rows]
    emb = EmbeddingFile(cache_dir, enc["sha256"], enc["max_tokens"]).embed(session, texts, "outcome prompts")
    models, targets = target_matrix(rows)
    return OutcomeSet(list(rows), models, targets, emb, feature_matrix(texts))
