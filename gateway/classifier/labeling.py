r"""Difficulty labels for the classifier head: the small tier's surprise at a reference answer.

The label source: mean per-token negative log-likelihood (nats) of ShareGPT's reference answer given
the prompt, under Gemma 3 270M Q4_K_M (the small local tier) via llama.cpp, prefill only. The
example uses the served chat template (`--chat_format gemma`):

    <bos><start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n{answer}

Prompt capped to PROMPT_CAP tokens (head and tail kept), answer to ANSWER_CAP tokens. Logits are
requested only at the positions that predict answer tokens (Gemma's vocabulary has 262k
entries, so the LM head dominates otherwise); log-softmax is a float64 logsumexp in numpy.
`finalize` turns NLLs into rank-percentile labels in [0, 1] and a deterministic 80/20 split.
See models/difficulty/labels/README.md for the procedure, commands and measured numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np
import numpy.typing as npt

from gateway.classifier.sharegpt import first_exchanges

PROMPT_CAP = 512
ANSWER_CAP = 128
HELDOUT_PERCENT = 20
USER_OPEN = "<start_of_turn>user\n"
MODEL_OPEN = "<end_of_turn>\n<start_of_turn>model\n"
Row = dict[str, Any]


def cap_head_tail(tokens: Sequence[int], cap: int) -> list[int]:
    """At most `cap` tokens: the first ceil(cap/2) and the last floor(cap/2) when too long."""
    if len(tokens) <= cap:
        return list(tokens)
    head = (cap + 1) // 2
    tail = cap - head
    return list(tokens[:head]) + (list(tokens[len(tokens) - tail :]) if tail else [])


def mean_nll(logits: npt.NDArray[np.float32], targets: Sequence[int], rows: int = 4) -> float:
    """Mean of -log softmax(logits[j])[targets[j]]: float64 logsumexp, `rows` rows at a time in place."""
    total = 0.0
    buf = np.empty((min(rows, len(targets)), logits.shape[1]), dtype=np.float64)
    for start in range(0, len(targets), rows):
        block = logits[start : start + rows]
        out = buf[: block.shape[0]]
        np.copyto(out, block)
        peak = out.max(axis=1, keepdims=True)
        np.subtract(out, peak, out=out)
        np.exp(out, out=out)
        lse = peak[:, 0] + np.log(out.sum(axis=1))
        picked = block[np.arange(block.shape[0]), np.asarray(targets[start : start + rows])]
        total += float((lse - picked.astype(np.float64)).sum())
    return total / len(targets)


@dataclass(frozen=True, slots=True)
class Example:
    """Token ids of one formatted example; answer tokens start at `answer_start`."""

    tokens: list[int]
    answer_start: int
    prompt_tokens: int  # before capping
    answer_tokens_full: int  # before capping


class NllScorer:
    """Gemma via llama.cpp's low-level API: one context, logits only where answer tokens are predicted."""

    def __init__(self, model_path: Path, n_threads: int = 1, n_ctx: int = 1024) -> None:
        import llama_cpp as lc

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter
        self._lc = lc
        lc.llama_backend_init()
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self._model = lc.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {model_path}")
        cparams = lc.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED  # as the served tier (Llama's default)
        self._ctx = lc.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = int(lc.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = n_ctx
        self.bos = int(lc.llama_vocab_bos(self._vocab))
        self._batch = lc.llama_batch_init(n_ctx, 0, 1)

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        """Token ids of `text`, no BOS; `special` parses markers like <start_of_turn>."""
        raw = text.encode("utf-8", errors="replace")
        size = len(raw) + 8
        buf = (self._lc.llama_token * size)()
        n = self._lc.llama_tokenize(self._vocab, raw, len(raw), buf, size, False, special)
        if n < 0:
            size = -n
            buf = (self._lc.llama_token * size)()
            n = self._lc.llama_tokenize(self._vocab, raw, len(raw), buf, size, False, special)
        return [int(t) for t in buf[:n]]

    def example(
        self, prompt: str, answer: str, prompt_cap: int = PROMPT_CAP, answer_cap: int = ANSWER_CAP
    ) -> Example:
        """BOS + Gemma chat template around the capped prompt, then the capped answer."""
        p = self.tokenize(prompt)
        a = self.tokenize(answer)
        user, model = self.tokenize(USER_OPEN, special=True), self.tokenize(MODEL_OPEN, special=True)
        head = [self.bos, *user, *cap_head_tail(p, prompt_cap), *model]
        return Example(head + a[:answer_cap], len(head), len(p), len(a))

    def nll(self, ex: Example) -> float:
        """Mean NLL of ex.tokens[answer_start:] given everything before, one decode call."""
        lc, batch, n = self._lc, self._batch, len(ex.tokens)
        if not 0 < ex.answer_start < n <= self.n_ctx:
            raise ValueError(f"example of {n} tokens does not fit n_ctx={self.n_ctx}")
        lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)
        batch.n_tokens = n
        for i, tok in enumerate(ex.tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if ex.answer_start - 1 <= i < n - 1 else 0
        if (code := lc.llama_decode(self._ctx, batch)) != 0:
            raise RuntimeError(f"llama_decode failed with code {code}")
        targets = ex.tokens[ex.answer_start :]
        logits = np.empty((len(targets), self.n_vocab), dtype=np.float32)
        for j in range(len(targets)):
            ptr = lc.llama_get_logits_ith(self._ctx, ex.answer_start - 1 + j)
            row = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
            logits[j] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
        return mean_nll(logits, targets)

    def close(self) -> None:
        """Free the batch, context and model."""
        self._lc.llama_batch_free(self._batch)
        self._lc.llama_free(self._ctx)
        self._lc.llama_model_free(self._model)


_SCRIPTS = (  # (language, code point ranges); the first script with the most letters wins
    ("ko", ((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F))),
    ("ja", ((0x3040, 0x30FF),)),
    ("zh", ((0x4E00, 0x9FFF), (0x3400, 0x4DBF))),
    ("ru", ((0x0400, 0x04FF),)),
    ("ar", ((0x0600, 0x06FF),)),
    ("th", ((0x0E00, 0x0E7F),)),
    ("hi", ((0x0900, 0x097F),)),
)
_STOPWORDS = {  # distinctive function words of Latin-script languages
    "en": {"the", "and", "is", "are", "you", "what", "how", "with", "this", "that", "of", "for", "write"},
    "es": {"el", "los", "las", "una", "por", "para", "con", "que", "es", "como", "del", "qué"},
    "fr": {"le", "les", "des", "une", "est", "et", "pour", "avec", "dans", "vous", "je", "sur"},
    "de": {"der", "die", "das", "und", "ist", "nicht", "mit", "ein", "eine", "ich", "sie", "für"},
    "pt": {"os", "uma", "não", "são", "com", "para", "como", "você", "em", "um", "que", "dos"},
    "it": {"il", "gli", "che", "di", "per", "una", "sono", "non", "della", "come", "questo", "con"},
}


def guess_language(text: str, sample_chars: int = 2000) -> str:
    """Cheap language guess: dominant non-Latin script, else Latin stopword vote ("en" on ties/none)."""
    head = text[:sample_chars]
    counts: dict[str, int] = {}
    latin = 0
    for ch in head:
        if not ch.isalpha():
            continue
        code = ord(ch)
        if code < 0x250:
            latin += 1
            continue
        for lang, ranges in _SCRIPTS:
            if any(lo <= code <= hi for lo, hi in ranges):
                counts[lang] = counts.get(lang, 0) + 1
                break
    if counts.get("ja", 0) and counts.get("ja", 0) * 5 >= counts.get("zh", 0):
        counts["ja"] += counts.pop("zh", 0)  # Japanese mixes kana with kanji
    if counts:
        lang, n = max(counts.items(), key=lambda kv: kv[1])
        if n >= latin:
            return lang
    if latin == 0:
        return "other"
    words = [w.strip(".,;:!?¿¡\"'()") for w in head.lower().split()]
    votes = {lang: sum(w in sw for w in words) for lang, sw in _STOPWORDS.items()}
    best = max(votes, key=lambda k: (votes[k], k == "en"))
    return best if votes[best] > votes["en"] else "en"


def rank_labels(values: Sequence[float]) -> list[float]:
    """Rank percentile in [0, 1]: (average rank - 1) / (n - 1); ties share a label; n == 1 -> 0.5."""
    n = len(values)
    if n == 1:
        return [0.5]
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 / (n - 1)
        i = j + 1
    return ranks


def split_of(conv_id: str) -> str:
    """"heldout" for ~20% of conversations by a hash of the id without its `_N` part suffix, else "train".

    ShareGPT V3 cuts long conversations into parts `X_0`, `X_1`, ...; hashing the stem keeps every
    part of one conversation on the same side.
    """
    stem = conv_id.rsplit("_", 1)[0] if "_" in conv_id else conv_id
    bucket = int.from_bytes(hashlib.sha256(stem.encode()).digest()[:8], "big") % 100
    return "heldout" if bucket < HELDOUT_PERCENT else "train"


def sample(seed: int, limit: int, data: Path | None = None) -> list[tuple[str, str, str]]:
    """`limit` first exchanges: seeded shuffle of all complete ones, first of each distinct prompt."""
    pool = list(first_exchanges(data))
    random.Random(seed).shuffle(pool)
    seen: set[str] = set()
    picked: list[tuple[str, str, str]] = []
    for item in pool:
        key = " ".join(item[1].split()).lower()
        if key not in seen:
            seen.add(key)
            picked.append(item)
            if len(picked) == limit:
                break
    return picked


def read_rows(path: Path) -> list[Row]:
    """The JSONL rows of `path` (none if missing); a torn last line is ignored, any other bad line raises.

    Lines end at "\n" only: prompts hold U+2028 and friends, which `str.splitlines` would split on.
    """
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    rows: list[Row] = []
    for n, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if n < len(lines):  # complete lines (ended by "\n") must parse
                raise ValueError(f"{path}:{n}: not a JSON row: {exc}") from None
    return rows


@contextlib.contextmanager
def _locked_append(path: Path) -> Iterator[TextIO]:
    """`path` open for appending under an exclusive lock (one writer at a time), torn last line cut."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another labeling run holds {path}") from None
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):  # a run killed mid-write
            os.truncate(path, data.rfind(b"\n") + 1)
        yield f


class Scorer(Protocol):
    """What labeling needs from a model: build an example, score it (NllScorer; fakes in tests)."""

    def example(self, prompt: str, answer: str, prompt_cap: int, answer_cap: int) -> Example: ...

    def nll(self, ex: Example) -> float: ...


def label_rows(
    scorer: Scorer,
    items: Iterable[tuple[str, str, str]],
    prompt_cap: int = PROMPT_CAP,
    answer_cap: int = ANSWER_CAP,
) -> Iterator[Row]:
    """One unlabeled row (no `label` / `split` yet) per (id, prompt, answer)."""
    for conv_id, prompt, answer in items:
        ex = scorer.example(prompt, answer, prompt_cap, answer_cap)
        start = time.perf_counter()
        nll = scorer.nll(ex)
        yield {
            "id": conv_id,
            "prompt": prompt,
            "prompt_tokens": ex.prompt_tokens,
            "answer_tokens": len(ex.tokens) - ex.answer_start,
            "answer_tokens_full": ex.answer_tokens_full,
            "nll": round(nll, 6),
            "language": guess_language(prompt),
            "seconds": round(time.perf_counter() - start, 4),
        }


def label_into(
    out: Path,
    items: Sequence[tuple[str, str, str]],
    scorer: Scorer,
    prompt_cap: int = PROMPT_CAP,
    answer_cap: int = ANSWER_CAP,
) -> int:
    """Append a row per item whose id `out` lacks, flushing each (progress on stderr); rows written."""
    with _locked_append(out) as f:
        done = {str(r["id"]) for r in read_rows(out)}
        todo = [item for item in items if item[0] not in done]
        print(f"{len(done)} done, {len(todo)} to label", file=sys.stderr)
        start, k = time.perf_counter(), 0
        for k, row in enumerate(label_rows(scorer, todo, prompt_cap, answer_cap), 1):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            rate = (time.perf_counter() - start) / k
            eta = rate * (len(todo) - k) / 60
            line = f"[{len(done) + k}/{len(done) + len(todo)}] {rate:.2f} s/example, ETA {eta:.1f} min"
            print(line, file=sys.stderr, flush=True)
    return k


def run(args: argparse.Namespace) -> int:
    """Label `--limit` sampled conversations into `--out`; a started file needs `--resume`."""
    if read_rows(args.out) and not args.resume:
        print(f"{args.out} already has rows: pass --resume to continue it", file=sys.stderr)
        return 2
    items = sample(args.seed, args.limit, args.data)
    from gateway.local.models import Q4, resolve

    scorer = NllScorer(args.model or resolve(Q4), n_threads=args.threads)
    try:
        label_into(args.out, items, scorer, args.prompt_cap, args.answer_cap)
    finally:
        scorer.close()
    return 0


def finalize(path: Path) -> dict[str, Any]:
    """Add `label` (NLL rank percentile over all rows) and `split` to every row, rewrite atomically."""
    with _locked_append(path):
        rows = _first_per_id(read_rows(path))
        if not rows:
            raise ValueError(f"{path} has no rows to finalize")
        _finalize_rows(rows, path)
    return stats(rows)


def _first_per_id(rows: Sequence[Row]) -> list[Row]:
    """Rows with a new id only (two runs on one file may have scored an id twice)."""
    seen: set[str] = set()
    kept: list[Row] = []
    for row in rows:
        if str(row["id"]) not in seen:
            seen.add(str(row["id"]))
            kept.append(row)
    if len(kept) < len(rows):
        print(f"dropped {len(rows) - len(kept)} rows with a repeated id", file=sys.stderr)
    return kept


def _finalize_rows(rows: list[Row], path: Path) -> None:
    """Set `label` and `split` on `rows`, then replace `path` with them (write + rename)."""
    for row, label in zip(rows, rank_labels([float(r["nll"]) for r in rows])):
        row["label"] = round(label, 6)
        row["split"] = split_of(str(row["id"]))
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Rank correlation; None when a side is constant."""
    rx, ry = np.array(rank_labels(x)), np.array(rank_labels(y))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return round(float(np.corrcoef(rx, ry)[0, 1]), 3)


def stats(rows: Sequence[Row]) -> dict[str, Any]:
    """Counts, NLL percentiles, per-language means, length correlations and cost of finalized rows."""
    nll = np.array([r["nll"] for r in rows], dtype=np.float64)
    secs = np.array([r.get("seconds", 0.0) for r in rows], dtype=np.float64)
    langs: dict[str, list[Row]] = {}
    for r in rows:
        langs.setdefault(str(r["language"]), []).append(r)
    pct = (1, 5, 10, 25, 50, 75, 90, 95, 99)
    return {
        "rows": len(rows),
        "splits": {s: sum(r["split"] == s for r in rows) for s in ("train", "heldout")},
        "hard_share": {
            s: round(float(np.mean([r["label"] >= 0.5 for r in rows if r["split"] == s] or [0.0])), 3)
            for s in ("train", "heldout")
        },
        "nll_percentiles": {f"p{p}": round(float(v), 3) for p, v in zip(pct, np.percentile(nll, pct))},
        "nll_mean": round(float(nll.mean()), 3),
        "languages": {
            lang: {
                "n": len(rs),
                "mean_nll": round(float(np.mean([r["nll"] for r in rs])), 3),
                "mean_label": round(float(np.mean([r["label"] for r in rs])), 3),
            }
            for lang, rs in sorted(langs.items(), key=lambda kv: -len(kv[1]))
        },
        "spearman_label_vs": {
            key: _spearman([float(r["label"]) for r in rows], [float(r[key]) for r in rows])
            for key in ("prompt_tokens", "answer_tokens", "answer_tokens_full")
        },
        "seconds_per_example": {
            "mean": round(float(secs.mean()), 3),
            "p50": round(float(np.median(secs)), 3),
        },
        "cpu_seconds_total": round(float(secs.sum()), 1),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gateway.classifier.labeling", description="Label prompt difficulty.")
    p.add_argument("--out", type=Path, required=True, help="JSONL file of labeled rows")
    p.add_argument("--limit", type=int, default=3000, help="conversations to sample and label")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffle that samples conversations")
    p.add_argument("--resume", action="store_true", help="continue a run: skip ids already in --out")
    p.add_argument("--finalize", action="store_true", help="only add rank labels + splits, print stats")
    p.add_argument("--threads", type=int, default=1, help="llama.cpp threads")
    p.add_argument("--prompt-cap", type=int, default=PROMPT_CAP, help="prompt tokens kept (head + tail)")
    p.add_argument("--answer-cap", type=int, default=ANSWER_CAP, help="answer tokens scored")
    p.add_argument("--data", type=Path, default=None, help="ShareGPT JSON (default: the packaged one)")
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: gemma3-270m-q4_k_m)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: label (default) or `--finalize`."""
    args = _parser().parse_args(argv)
    if args.finalize:
        print(json.dumps(finalize(args.out), indent=2, ensure_ascii=False))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
