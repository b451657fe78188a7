"""Cheap deterministic tokenizer, prefix-block hashing and output-token generation.

Prompt tokens: every regex match of a word (``\\w+``) or of one non-space symbol is one
token. Compared with a BPE tokenizer this undercounts long or rare words (~1.3 BPE tokens
per English word) but is stable, fast and good enough for relative physics.

Output tokens are drawn from a fixed vocabulary of common English words; the draw is
seeded by (engine seed, stable hash of the prompt, request `seed`), so the same request
always yields the same text and length, whatever the arrival order.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np
import orjson

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "can so what more will no other time some could them into only new about then these "
    "two may first any like now my such make over our even most after also did many before "
    "must through back years where much your way well down should because each just those "
    "people how too little state good very world still see own men work long here between "
    "both life being under never day same another know while last might great old year off "
    "come since against go came right used take three system model token cache request "
    "latency stream batch memory gateway tier route server answer prompt value"
).split()
VOCAB: tuple[str, ...] = tuple(" " + w for w in _WORDS) + (".", ",", ";", "\n")
VOCAB_JSON: tuple[bytes, ...] = tuple(orjson.dumps(t) for t in VOCAB)


def tokenize(text: str) -> list[str]:
    """Split text into regex tokens (words and single symbols)."""
    return _TOKEN_RE.findall(text)


def stable_hash(data: str | Sequence[int]) -> int:
    """A process-independent 32-bit hash of a prompt (text or token ids)."""
    raw = data.encode() if isinstance(data, str) else ",".join(map(str, data)).encode()
    return zlib.crc32(raw)


def block_hashes(tokens: Sequence[str | int], block_size: int, cache_salt: str | None = None) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (vLLM-style prefix-cache keys); a request's `cache_salt`
    is mixed into the first block's, as vLLM does, so the chain, and every block, is the salt's own."""
    out: list[int] = []
    h = 0 if cache_salt is None else hash(("cache_salt", cache_salt))
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tuple(tokens[start : start + block_size])))
        out.append(h)
    return out


def choice_hash(prompt_hash: int, index: int) -> int:
    """The hash seeding choice `index` of a prompt (index 0: the prompt's own, what n = 1 gets)."""
    return prompt_hash if index == 0 else stable_hash(f"{prompt_hash}#{index}")


def output_rng(seed: int, prompt_hash: int, request_seed: int | None) -> np.random.Generator:
    """The generator that decides a request's output length and tokens."""
    extra = 0 if request_seed is None else (request_seed & 0xFFFFFFFFFFFF) + 1
    return np.random.default_rng([seed & 0xFFFFFFFF, prompt_hash, extra])


def draw_tokens(rng: np.random.Generator, n: int) -> list[int]:
    """`n` vocabulary indices."""
    return rng.integers(0, len(VOCAB), n).tolist() if n > 0 else []


def detokenize(ids: Sequence[int]) -> str:
    """The text of output token ids."""
    return "".join(VOCAB[i] for i in ids)


_VOCAB_RE = re.compile(r" \w+|[.,;\n]")


def output_count(text: str) -> int | None:
    """How many output tokens `text` is, when it is made of vocabulary tokens (None: it is not)."""
    pieces = _VOCAB_RE.findall(text)
    return len(pieces) if "".join(pieces) == text else None


def token_logprobs(choice_hash: int, ids: Sequence[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """Deterministic log-probabilities of a choice's tokens: per token its own logprob and the `top` most likely
    tokens (itself first, as a greedy model's pick is the most likely; then distinct others, each less likely)."""
    if not ids:
        return []
    rng = np.random.default_rng([choice_hash, 0x10C])
    own = (-rng.exponential(0.35, len(ids))).tolist()
    out: list[tuple[float, list[tuple[int, float]]]] = []
    vocab = len(VOCAB)
    for tok, lp in zip(ids, own):
        alts: list[tuple[int, float]] = [(tok, lp)] if top > 0 else []
        if top > 1:
            offsets = rng.choice(vocab - 1, size=top - 1, replace=False) + 1
            gaps = np.cumsum(rng.exponential(1.0, top - 1) + 0.01)
            alts += [((tok + int(o)) % vocab, lp - float(g)) for o, g in zip(offsets, gaps)]
        out.append((lp, alts))
    return out
