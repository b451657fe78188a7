"""The serving difficulty scorer: prompt -> [cascade] -> features (CachedEmbedder) -> ONNX head.

    clf = load_classifier(Path("models/difficulty"), store=embedding_store)
    clf.use_cuts([0.043221, 0.1617])          # the policies' band cuts: turns the cascade on
    difficulty = await clf.score(prompt)      # in [0, 1]

The features come from the head's encoder graph (metrics.json `encoder.graph`: `difficulty`, the
first 4 MiniLM layers, since v2; `encoder.max_tokens`: the head + tail token window, 256 before v4)
through a CachedEmbedder: in-process LRU, else the optional shared store, else the micro-batched
encoder. The head runs inline: one tiny ONNX call of a few microseconds. `load_classifier` reads
head.onnx + metrics.json and refuses an encoder file whose SHA-256 differs from the one the head was
trained or evaluated with.

With cascade.json in the folder (gateway.classifier.cascade; off with GATEWAY_CLASSIFIER_CASCADE=off),
a prompt not in the LRU first gets a cheap score from static token embeddings; when that score puts
the prompt in one band for sure (no cut of `use_cuts` inside its calibrated interval) it is the
answer and the encoder does not run; else the encoder runs as without a cascade. Until the cuts are
known (`use_cuts` / `follow_cuts`), every prompt goes to the encoder. `sentence_embedder` gives the
semantic cache its own embedder on the 6-layer sentence graph, opened on first use.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from gateway.classifier.batcher import MicroBatcher
from gateway.classifier.cascade import Cascade, load_cascade
from gateway.classifier.embedder import OFFLINE_SCOPE, CachedEmbedder, LazyEncoder, SharedEmbeddings, log
from gateway.classifier.embedding_cache import EmbeddingCache, scoped_key
from gateway.classifier.encoder import (
    GPU_VARIANT,
    GRAPHS,
    SENTENCE,
    EncoderSession,
    Graph,
    default_model_path,
    default_providers,
    preferred_variant,
)
from gateway.classifier.head import HeadSession, log_chars
from gateway.classifier.tokenize import PromptTokenizer

DEFAULT_MAX_TOKENS = 256  # the token window of heads whose metrics.json does not name one (before v4)
CASCADE_ENV = "GATEWAY_CLASSIFIER_CASCADE"  # off / 0 / false: serve without the cascade


class EncoderMismatch(ValueError):
    """The encoder file on disk is not the one the head was trained or evaluated with."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class DifficultyClassifier:
    """`score(text)` in [0, 1] (the DifficultyScorer protocol); `close()` when done."""

    def __init__(
        self, embedder: CachedEmbedder, head: HeadSession, *, provider: str = "CPUExecutionProvider",
        encoder_variant: str = "", cascade: Cascade | None = None, tokenizer: PromptTokenizer | None = None,
        decided_entries: int = 4096,
    ) -> None:
        if cascade is not None and tokenizer is None:
            raise ValueError("a cascade needs the encoder's tokenizer")
        self.embedder = embedder
        self.head = head
        self.provider = provider
        self.encoder_variant = encoder_variant
        self.cascade = cascade
        self.tokenizer = tokenizer
        self.cheap = 0  # scores the cascade decided (cold or remembered) without the encoder
        self.full = 0  # scores that took the encoder path (LRU, shared store or the encoder)
        self._decided: OrderedDict[str, float] = OrderedDict()  # the cascade's answers, for repeated prompts
        self._decided_entries = decided_entries
        self._current_cuts: Callable[[], Iterable[float] | None] | None = None
        self._cuts_seen: object = None

    def use_cuts(self, cuts: Iterable[float] | None) -> None:
        """The band cuts of the policies being served; None: unknown (the cascade decides nothing)."""
        if self.cascade is not None:
            self.cascade.use_cuts(cuts)
            self._decided.clear()

    def follow_cuts(self, current: Callable[[], Iterable[float] | None]) -> None:
        """Take the cuts from `current()` at each score: a new object (a reloaded policy) replaces them."""
        self._current_cuts = current

    async def score(self, text: str, *, scope: str = OFFLINE_SCOPE) -> float:
        """The prompt's difficulty for the small tier, in [0, 1]; what is remembered of `text` (its embedding,
        the cascade's answer) is kept in `scope`, a tenant's on the serving path (gateway.keyspace)."""
        if self.cascade is not None:
            try:
                cheap = self._cheap_score(text, scope)
            except Exception as err:  # the cascade only saves work: without it every prompt takes the encoder
                log.error("cascade_failed", error=f"{type(err).__name__}: {err}", action="cascade off")
                self.cascade, cheap = None, None
            if cheap is not None:
                self.cheap += 1
                return cheap
        self.full += 1
        features = await self.embedder.embedding(text, scope=scope)
        return float(self.head.score(features.reshape(1, -1), log_chars([text]))[0])

    def _cheap_score(self, text: str, scope: str) -> float | None:
        """The cascade's score when it settles the band, else None (the ids are left for the encoder)."""
        assert self.cascade is not None and self.tokenizer is not None
        if self._current_cuts is not None and (cuts := self._current_cuts()) is not self._cuts_seen:
            self._cuts_seen = cuts
            self.use_cuts(cuts)
        if self.cascade.cuts is None:
            return None
        key = scoped_key(scope, text)
        if key in self.embedder.cache:
            return None  # the exact score is a lookup away
        if (known := self._decided.get(key)) is not None:
            self._decided.move_to_end(key)
            return known
        ids = self.tokenizer.ids(text)
        score = self.cascade.decide(ids, len(text))
        if score is None:
            self.tokenizer.remember(text, ids)
            return None
        self._decided[key] = score
        if len(self._decided) > self._decided_entries:
            self._decided.popitem(last=False)
        return score

    def close(self) -> None:
        self.embedder.close()

    async def aclose(self) -> None:
        await self.embedder.aclose()


def read_metrics(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: train the head with `gateway train --out {model_dir}`")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _known_encoders(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Encoder variants the head may run on: the trained one, plus those evaluated as compatible."""
    trained = metrics["encoder"]
    known = dict(metrics.get("compatible_encoders") or {})
    known = {v: e for v, e in known.items() if e.get("compatible", True)}
    known[str(trained["variant"])] = trained
    return known


def choose_variant(metrics: dict[str, Any], wanted: str | None, providers: Sequence[str]) -> str:
    """`wanted`, else the GPU variant on CUDA when the head was evaluated with it, else the trained one."""
    trained = str(metrics["encoder"]["variant"])
    known = _known_encoders(metrics)
    if wanted is not None:
        if wanted not in known:
            raise EncoderMismatch(
                f"the head was trained/evaluated with encoder variants {sorted(known)}, not {wanted!r}; "
                f"retrain with `gateway train --encoder-variant {wanted}` (or --eval-variants {wanted})"
            )
        return wanted
    on_gpu = bool(providers) and providers[0] == "CUDAExecutionProvider"
    return GPU_VARIANT if on_gpu and GPU_VARIANT in known else trained


def max_tokens_of(metrics: dict[str, Any]) -> int:
    """The token window the head was trained on (metrics.json `encoder.max_tokens`; 256 before v4)."""
    return int(metrics["encoder"].get("max_tokens", DEFAULT_MAX_TOKENS))


def encoder_graph(metrics: dict[str, Any]) -> Graph:
    """The graph the head reads (metrics.json `encoder.graph`; heads from before v2 read `sentence`)."""
    name = str(metrics["encoder"].get("graph", SENTENCE.name))
    if name not in GRAPHS:
        raise EncoderMismatch(f"metrics.json names encoder graph {name!r}; this gateway knows {sorted(GRAPHS)}")
    return GRAPHS[name]


def open_parts(
    model_dir: Path, *, encoder_variant: str | None = None, providers: Sequence[str] | None = None, threads: int = 1
) -> tuple[EncoderSession, HeadSession, str, str]:
    """The checked encoder session, the head session, the encoder variant chosen and its file's SHA-256."""
    metrics = read_metrics(model_dir)
    chosen = list(providers) if providers is not None else default_providers()
    variant = choose_variant(metrics, encoder_variant, chosen)
    known = _known_encoders(metrics)
    path = default_model_path(variant, encoder_graph(metrics))
    expected, actual = str(known[variant]["sha256"]), file_sha256(path)
    if actual != expected:
        raise EncoderMismatch(
            f"{path} has sha256 {actual[:16]}..., but {model_dir / 'metrics.json'} records {expected[:16]}... "
            f"for encoder variant {variant}: the head was trained on another encoder file; restore that "
            "file or retrain the head with `gateway train`"
        )
    tokenizer = PromptTokenizer(max_tokens_of(metrics))
    encoder = EncoderSession(path, providers=chosen, threads=threads, tokenizer=tokenizer)
    return encoder, HeadSession(model_dir / "head.onnx"), variant, actual


def namespace_of(path: Path, sha256: str, max_tokens: int = DEFAULT_MAX_TOKENS) -> str:
    """The shared-store namespace of an encoder file read with a token window: its name, the start of its
    SHA-256, and the window when it is not the default (the same file reads other tokens under another)."""
    window = "" if max_tokens == DEFAULT_MAX_TOKENS else f".t{max_tokens}"
    return f"{path.stem}.{sha256[:12]}{window}"


def cascade_wanted(wanted: bool | None) -> bool:
    """`wanted`, else on unless GATEWAY_CLASSIFIER_CASCADE is off / 0 / false / no."""
    if wanted is not None:
        return wanted
    return os.environ.get(CASCADE_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def load_classifier(
    model_dir: Path,
    *,
    encoder_variant: str | None = None,
    providers: Sequence[str] | None = None,
    store: SharedEmbeddings | None = None,
    threads: int = 1,
    cache_entries: int = 4096,
    window_s: float = 0.002,
    max_batch: int = 32,
    cascade: bool | None = None,
    cuts: Iterable[float] | None = None,
) -> DifficultyClassifier:
    """A ready DifficultyClassifier for the trained model in `model_dir` (blocking: call at startup).

    `cascade`: use the folder's cascade.json when there is one (None: unless GATEWAY_CLASSIFIER_CASCADE=off);
    `cuts`: the band cuts it must respect (also later: `use_cuts`, `follow_cuts`)."""
    encoder, head, variant, sha = open_parts(model_dir, encoder_variant=encoder_variant, providers=providers, threads=threads)
    tokens = encoder.tokenizer.max_tokens
    embedder = CachedEmbedder(
        MicroBatcher(encoder, window_s=window_s, max_batch=max_batch),
        namespace=namespace_of(encoder.model_path, sha, tokens), store=store, cache=EmbeddingCache(cache_entries),
    )
    chosen = None
    if cascade_wanted(cascade):
        chosen = load_cascade(model_dir, head_sha256=file_sha256(model_dir / "head.onnx"), max_tokens=tokens)
    classifier = DifficultyClassifier(embedder, head, provider=encoder.provider, encoder_variant=variant, cascade=chosen,
                                      tokenizer=encoder.tokenizer, decided_entries=cache_entries)
    classifier.use_cuts(cuts)
    return classifier


def sentence_embedder(
    provider: str, *, store: SharedEmbeddings | None = None, threads: int = 1,
    cache_entries: int = 4096, window_s: float = 0.002, max_batch: int = 32,
) -> CachedEmbedder:
    """The semantic cache's embedder on `provider` (the classifier's): all-MiniLM-L6-v2's sentence
    embedding (6 layers), opened on first use."""
    variant = preferred_variant(SENTENCE, [provider])
    run_on = [provider, "CPUExecutionProvider"] if variant == GPU_VARIANT else ["CPUExecutionProvider"]
    path = default_model_path(variant, SENTENCE)
    lazy = LazyEncoder(lambda: EncoderSession(path, providers=run_on, threads=threads))
    return CachedEmbedder(
        MicroBatcher(lazy, window_s=window_s, max_batch=max_batch), namespace=namespace_of(path, file_sha256(path)),
        store=store, cache=EmbeddingCache(cache_entries),
    )
