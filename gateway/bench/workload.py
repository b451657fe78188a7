"""Benchmark workloads: ShareGPT V3 single requests and conversations, or synthetic fixed lengths.

Token counts use the emulator's tokenizer (a word or a symbol is one token), the backend fleet
these benchmarks run against. ShareGPT requests follow `vllm bench serve`: the prompt and the
output length both come from the data (output length = tokens of the reference answer), and
pairs with fewer than 4 tokens on either side or longer than the caps are skipped.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.emulator.tokens import VOCAB, tokenize
from gateway.training.sharegpt import Conversation, first_exchange, first_exchanges, iter_conversations

Message = dict[str, str]
MIN_TOKENS = 4


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request to send: the chat messages, its max_tokens and what it is part of."""

    messages: tuple[Message, ...]
    max_tokens: int
    prompt_tokens: int  # estimate: emulator tokens of the messages' text
    conversation_id: str = ""
    turn: int = 0  # 0 = first turn; turn k carries k earlier exchanges


def count_tokens(text: str) -> int:
    """Tokens of `text` as the emulator counts them."""
    return len(tokenize(text))


def _spec(history: Sequence[Message], prompt: str, answer: str, conv: str, turn: int) -> RequestSpec:
    messages = (*history, {"role": "user", "content": prompt})
    tokens = sum(count_tokens(m["content"]) for m in messages)
    return RequestSpec(messages, count_tokens(answer), tokens, conv, turn)


def _fits(spec: RequestSpec, max_prompt: int, max_total: int) -> bool:
    return (spec.prompt_tokens >= MIN_TOKENS and spec.max_tokens >= MIN_TOKENS
            and spec.prompt_tokens <= max_prompt and spec.prompt_tokens + spec.max_tokens <= max_total)


def _pool(conversations: Iterable[Conversation], size: int, seed: int) -> list[Conversation]:
    """The first `size` conversations of the file, shuffled with `seed` (fast, reproducible)."""
    pool: list[Conversation] = []
    for conv in conversations:
        pool.append(conv)
        if len(pool) >= size:
            break
    random.Random(seed).shuffle(pool)
    return pool


def sharegpt_requests(n: int, seed: int = 0, *, max_prompt_tokens: int = 1024, max_total_tokens: int = 2048,
                      path: Path | None = None, pool: int = 20_000) -> list[RequestSpec]:
    """`n` first-turn requests (prompt and output length from the data), sampled with `seed`."""
    out: list[RequestSpec] = []
    for conv in _pool(iter_conversations(path), pool, seed):
        pair = first_exchange(conv)
        if pair is None:
            continue
        spec = _spec((), pair[0], pair[1], conv.id, 0)
        if _fits(spec, max_prompt_tokens, max_total_tokens):
            out.append(spec)
            if len(out) >= n:
                break
    return out


def conversation_turns(conv: Conversation, max_turns: int) -> list[RequestSpec]:
    """Turn k: the earlier turns with their reference answers, then the k-th human message."""
    out: list[RequestSpec] = []
    history: list[Message] = []
    turns = conv.turns
    for i in range(len(turns) - 1):
        (role, text), (next_role, answer) = turns[i], turns[i + 1]
        if role != "human" or next_role != "gpt" or not text.strip() or not answer.strip():
            continue
        out.append(_spec(history, text, answer, conv.id, len(out)))
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        if len(out) >= max_turns:
            break
    return out


def sharegpt_conversations(n: int, max_turns: int, seed: int = 0, *, max_total_tokens: int = 8192,
                           path: Path | None = None, pool: int = 20_000) -> list[list[RequestSpec]]:
    """`n` conversations of 1 to `max_turns` turns; a conversation stops at its first turn too long."""
    out: list[list[RequestSpec]] = []
    for conv in _pool(iter_conversations(path), pool, seed):
        turns: list[RequestSpec] = []
        for spec in conversation_turns(conv, max_turns):
            if not _fits(spec, max_total_tokens, max_total_tokens):
                break
            turns.append(spec)
        if turns:
            out.append(turns)
            if len(out) >= n:
                break
    return out


def interleave(conversations: Sequence[Sequence[RequestSpec]]) -> list[RequestSpec]:
    """One request list: every conversation's turn 0, then every turn 1, ... (turn order kept)."""
    out: list[RequestSpec] = []
    depth = max((len(c) for c in conversations), default=0)
    for k in range(depth):
        out += [c[k] for c in conversations if k < len(c)]
    return out


def _words(rng: random.Random, n: int) -> Iterator[str]:
    for _ in range(n):
        yield rng.choice(VOCAB).strip() or "x"


def synthetic_requests(n: int, prompt_tokens: int, output_tokens: int, seed: int = 0) -> list[RequestSpec]:
    """`n` requests of `prompt_tokens` random vocabulary words each (no shared prefix beyond chance)
    asking for exactly `output_tokens` (send them with ignore_eos)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(_words(rng, prompt_tokens))
        out.append(RequestSpec(({"role": "user", "content": text},), output_tokens, count_tokens(text), f"syn-{i}"))
    return out


def sharegpt_prompts(count: int, *, distinct: bool, max_chars: int = 8000, skip: int = 0) -> list[str]:
    """The first `count` ShareGPT V3 first-turn prompts (after `skip`), in dataset order, at most
    `max_chars` long; `distinct`: each normalized text (whitespace runs collapsed) only once."""
    out: list[str] = []
    seen: set[str] = set()
    skipped = 0
    for _, prompt, _ in first_exchanges():
        if len(prompt) > max_chars:
            continue
        if distinct:
            norm = " ".join(prompt.split())
            if norm in seen:
                continue
            seen.add(norm)
        if skipped < skip:
            skipped += 1
            continue
        out.append(prompt)
        if len(out) >= count:
            break
    return out
