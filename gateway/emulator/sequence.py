"""One generation request inside the engine, and the handler's way to wait on it."""

from __future__ import annotations

import asyncio
import enum


class SeqState(enum.Enum):
    NEW = "new"  # created, not yet queued (e.g. stalled by a fault)
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"  # all output tokens generated
    ABORTED = "aborted"  # released before finishing (cancelled or fault)


class Sequence:
    """Prompt, predetermined output tokens and progress of one request.

    The output ids are drawn up front (deterministic); the engine only decides *when*
    each token appears. `generated` is the number of tokens produced so far.
    """

    __slots__ = (
        "id", "prompt_tokens", "block_hashes", "output_ids", "max_tokens", "state", "generated",
        "cached_tokens", "admitted_once", "preemptions", "arrival", "first_token_at",
        "finished_at", "_waiter", "_want", "index", "choice_hash", "share", "group",
    )

    def __init__(
        self, seq_id: int, prompt_tokens: int, block_hashes: list[int], output_ids: list[int],
        max_tokens: int, index: int = 0, choice_hash: int = 0, share: PromptShare | None = None,
    ) -> None:
        self.id = seq_id
        self.prompt_tokens = prompt_tokens
        self.block_hashes = block_hashes
        self.output_ids = output_ids
        self.max_tokens = max_tokens
        self.state = SeqState.NEW
        self.generated = 0
        self.cached_tokens = 0  # prompt tokens served by the prefix cache
        self.admitted_once = False
        self.preemptions = 0
        self.arrival = 0.0  # engine clock (model seconds) at enqueue
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._want = 0  # the waiter wants generated > _want
        self.index = index  # the choice's index among its prompt's sequences
        self.choice_hash = choice_hash  # what seeded its output (and its logprobs)
        self.share = share  # the prompt blocks it shares with its siblings (n > 1), or None
        self.group: Group | None = None  # the request it belongs to when it has siblings

    @property
    def n_out(self) -> int:
        return len(self.output_ids)

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV the sequence holds while running."""
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.state is SeqState.FINISHED or self.state is SeqState.ABORTED

    @property
    def finish_reason(self) -> str:
        return "length" if self.n_out >= self.max_tokens else "stop"

    def notify(self) -> None:
        """Wake the waiting handler if what it waits for happened (called by the engine)."""
        if self.group is not None:
            self.group.notify()
            return
        w = self._waiter
        if w is not None and (self.generated > self._want or self.done):
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def wait(self, seen: int) -> int:
        """Return `generated` once it exceeds `seen` or the sequence is done."""
        if self.generated > seen or self.done:
            return self.generated
        w = asyncio.get_running_loop().create_future()
        self._waiter, self._want = w, seen
        await w
        return self.generated


class PromptShare:
    """The full prompt blocks the sequences of one prompt share (n or best_of > 1): their KV is held once while
    any of them runs, as vLLM's forked (v0) or prefix-cached (v1) siblings hold it."""

    __slots__ = ("tokens", "holders")

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.holders = 0  # running sequences holding the shared blocks


class Group:
    """The sequences of one request with several (prompts x n): one waiter for all of them."""

    __slots__ = ("seqs", "_waiter")

    def __init__(self, seqs: list[Sequence]) -> None:
        self.seqs = seqs
        self._waiter: asyncio.Future[None] | None = None
        for seq in seqs:
            seq.group = self

    @property
    def done(self) -> bool:
        return all(s.done for s in self.seqs)

    def notify(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def changed(self) -> None:
        """Return at the next progress of any sequence (callers check their state first, without awaiting)."""
        w = asyncio.get_running_loop().create_future()
        self._waiter = w
        await w
