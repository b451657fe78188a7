"""ONNX Runtime session for the prompt encoder: texts -> L2-normalized 384-d embeddings.

The graph (see gateway/training/export.py and models/minilm-l6-v2/MODEL_CARD.md) takes
input_ids, attention_mask, token_type_ids (int64, batch x seq) and returns `embedding`
(float32, batch x 384): mean pooling over the mask and L2 normalization are inside it.
Providers default to CUDA then CPU; without a usable CUDA library the session runs on CPU.
A file whose metadata says batch_invariant=false (dynamic int8: activation scales are computed
over the whole batch) is run one prompt at a time, without padding, so a prompt's embedding never
depends on what it was batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

import gateway
from gateway.classifier.tokenize import PromptTokenizer

EMBEDDING_DIM: Final = 384
MODEL_NAME: Final = "minilm-l6-v2"


@dataclass(frozen=True, slots=True)
class Graph:
    """Which part of MiniLM a file runs and what it pools.

    The output is the mean over the mask of each hidden state in `pooled` (0 = the word
    embeddings, k = after transformer layer k), each L2-normalized, summed, L2-normalized again.
    Layers after max(pooled) are not in the graph at all: they cost nothing.
    """

    name: str
    file_prefix: str
    layers: int
    pooled: tuple[int, ...]


# The sentence embedding of all-MiniLM-L6-v2 as trained (semantic cache; the classifier up to v1).
SENTENCE: Final = Graph("sentence", "model", 6, (6,))
# The difficulty classifier's features: layers 3 and 4 predict the label better than layer 6 on
# validation folds, and a graph without layers 5-6 costs two thirds (models/difficulty/MODEL_CARD.md).
DIFFICULTY: Final = Graph("difficulty", "difficulty", 4, (3, 4))
GRAPHS: Final[dict[str, Graph]] = {g.name: g for g in (SENTENCE, DIFFICULTY)}
VARIANTS: Final = ("fp32", "int8", "fp16")


def file_name(variant: str, graph: Graph = SENTENCE) -> str:
    """`<prefix>.<variant>.onnx`, e.g. model.int8.onnx or difficulty.int8.onnx."""
    return f"{graph.file_prefix}.{variant}.onnx"


CPU_VARIANT: Final = "int8"
GPU_VARIANT: Final = "fp16"
_PREFERRED_PROVIDERS: Final = ("CUDAExecutionProvider", "CPUExecutionProvider")
# Without a device, trying CUDA only logs a library-load error before falling back to CPU.
_GPU_DEVICE_NODES: Final = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg")

Embeddings = npt.NDArray[np.float32]
Feed = dict[str, npt.NDArray[np.int64]]


def models_dir() -> Path:
    """models/minilm-l6-v2/ of the repository the (editable) package lives in."""
    return Path(gateway.__file__).resolve().parents[1] / "models" / MODEL_NAME


def default_model_path(variant: str = CPU_VARIANT, graph: Graph = SENTENCE) -> Path:
    """The shipped ONNX file of `variant` (one of VARIANTS) of `graph`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown encoder variant {variant!r}; expected one of {sorted(VARIANTS)}")
    path = models_dir() / file_name(variant, graph)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: regenerate it with `python -m gateway.training.export "
            f"--out models/{MODEL_NAME} --graph {graph.name} --variants {variant}`"
        )
    return path


def default_providers() -> list[str]:
    """CUDA (when this onnxruntime build offers it and an NVIDIA device is visible) then CPU."""
    available = set(ort.get_available_providers())
    has_gpu = any(Path(node).exists() for node in _GPU_DEVICE_NODES)
    wanted = _PREFERRED_PROVIDERS if has_gpu else _PREFERRED_PROVIDERS[1:]
    return [p for p in wanted if p in available] or ["CPUExecutionProvider"]


class EncoderSession:
    """One onnxruntime session plus its tokenizer; `embed` is synchronous (run it in an executor)."""

    def __init__(
        self,
        model_path: Path,
        *,
        providers: Sequence[str] | None = None,
        threads: int = 1,
        tokenizer: PromptTokenizer | None = None,
    ) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        chosen = list(providers) if providers is not None else default_providers()
        self.model_path = Path(model_path)
        # ORT 1.31's CPU SkipLayerNormalization kernel is ~6x slower than Add + LayerNormalization.
        disabled = [] if chosen[:1] == ["CUDAExecutionProvider"] else ["SkipLayerNormFusion"]
        self._session = ort.InferenceSession(
            str(self.model_path), options, providers=chosen, disabled_optimizers=disabled
        )
        self.provider: str = str(self._session.get_providers()[0])
        metadata = self._session.get_modelmeta().custom_metadata_map
        self.batch_invariant: bool = metadata.get("batch_invariant", "true") != "false"
        self.tokenizer = tokenizer or PromptTokenizer()

    def embed(self, texts: Sequence[str]) -> Embeddings:
        """L2-normalized embeddings, float32 (len(texts), 384)."""
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        return self.embed_tokens(self.tokenizer.encode_batch(texts))

    def embed_tokens(self, feed: Feed) -> Embeddings:
        """Embeddings of a tokenized, right-padded batch (input_ids, attention_mask, token_type_ids)."""
        if self.batch_invariant:
            return self._run(feed)
        lengths = feed["attention_mask"].sum(axis=1)
        rows = [self._run({k: v[i : i + 1, : max(int(n), 1)] for k, v in feed.items()}) for i, n in enumerate(lengths)]
        return np.concatenate(rows) if rows else np.zeros((0, EMBEDDING_DIM), dtype=np.float32)

    def _run(self, feed: Feed) -> Embeddings:
        (out,) = self._session.run(["embedding"], feed)
        return np.ascontiguousarray(out, dtype=np.float32)


def preferred_variant(graph: Graph, providers: Sequence[str]) -> str:
    """GPU_VARIANT when CUDA comes first and its file is shipped, else CPU_VARIANT."""
    on_gpu = bool(providers) and providers[0] == "CUDAExecutionProvider"
    return GPU_VARIANT if on_gpu and (models_dir() / file_name(GPU_VARIANT, graph)).is_file() else CPU_VARIANT


def open_encoder(
    graph: Graph = SENTENCE, *, providers: Sequence[str] | None = None, threads: int = 1
) -> EncoderSession:
    """The shipped variant for the provider that actually runs: GPU_VARIANT on CUDA, else CPU_VARIANT."""
    chosen = list(providers) if providers is not None else default_providers()
    if preferred_variant(graph, chosen) == GPU_VARIANT:
        session = EncoderSession(default_model_path(GPU_VARIANT, graph), providers=chosen, threads=threads)
        if session.provider == "CUDAExecutionProvider":
            return session
    cpu_only = [p for p in chosen if p != "CUDAExecutionProvider"] or ["CPUExecutionProvider"]
    return EncoderSession(default_model_path(CPU_VARIANT, graph), providers=cpu_only, threads=threads)
