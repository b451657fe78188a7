"""The emulated inference engine: continuous batching, KV accounting, prefix cache.

One asyncio task runs the scheduler. Each step it (1) preempts the newest sequences if
the KV cache cannot hold one more token for every running sequence (vLLM recompute
preemption), (2) admits waiting sequences FIFO while `max_running`, KV capacity and the
per-step prefill budget allow, (3) sleeps prefill + decode time (see `physics.py`), then
(4) gives every running sequence one token. `step()` and `emit()` are plain methods, so
tests and what-if simulations can drive the engine on its model clock without sleeping.

A request of several prompts and choices (`create_all`: prompts x best_of, best_of >= n) is that many sequences,
each decoded like any other. The sequences of one prompt share its full blocks (`PromptShare`): the first to run
holds them and prefills the prompt, the others add only their last partial block and their own output, as vLLM's
forked or prefix-cached siblings do; `release_all` frees them together and records one request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence as Seq
from typing import Any

from . import physics, tokens
from .faults import FaultConfig, FaultInjector
from .prefix_cache import PrefixCache
from .parse import GenRequest
from .profiles import Profile
from .sequence import PromptShare, Sequence, SeqState
from .stats import EngineStats, RequestRecord, Status

MAX_LAG_S = 0.05  # how far the real-time scheduler may run behind before it stops catching up


class RequestError(ValueError):
    """A request the engine cannot serve (too long, empty); the handler answers 400."""


class Engine:
    """State of one emulated replica; see the module docstring for the step."""

    def __init__(self, profile: Profile, seed: int = 0, faults: FaultConfig | None = None) -> None:
        self.profile = profile
        self.seed = seed
        self.faults = FaultInjector(seed, faults)
        self.prefix_cache = PrefixCache(profile.prefix_cache_tokens, profile.block_size)
        self.stats = EngineStats()
        self.clock = 0.0  # model seconds (synced to the event-loop clock when running live)
        self.kv_used = 0  # tokens held by running sequences
        self._running: dict[int, Sequence] = {}
        self._waiting: deque[Sequence] = deque()
        self._n_waiting = 0
        self._next_id = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._offset: float | None = None  # loop.time() - clock, while running live

    def now(self) -> float:
        """The engine clock; follows the event-loop clock while the scheduler runs live."""
        if self._offset is None:
            return self.clock
        return max(self.clock, asyncio.get_running_loop().time() - self._offset)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._n_waiting

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.profile.kv_capacity_tokens

    # -- request side ------------------------------------------------------------------
    def create(
        self, prompt: Seq[str | int], prompt_hash: int, max_tokens: int | None, *,
        ignore_eos: bool = False, min_tokens: int = 0, request_seed: int | None = None,
        prefill: str | None = None, base_tokens: int = 0, index: int = 0, share: PromptShare | None = None,
        cache_salt: str | None = None,
    ) -> Sequence:
        """Validate a request and fix its output; raises RequestError. `prefill` continues an answer: the
        request's prompt is a prompt of `base_tokens` tokens (hashed as `prompt_hash`) plus this start of the
        answer, and the output is what follows it (`_continued`). `index` is the sequence's number among its
        prompt's (n > 1): each gets its own answer, index 0 the one n = 1 gets. `cache_salt` keys the prefix
        cache (vLLM's): the prompt's blocks are reused only by requests of the same salt; the answer is the same."""
        p = self.profile
        n_prompt = len(prompt)
        limit = p.max_model_len
        if n_prompt == 0:
            raise RequestError("prompt is empty")
        given = max_tokens
        if max_tokens is None:
            max_tokens = max(1, min(p.default_max_tokens, limit - n_prompt))
        if n_prompt + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        min_tokens = min(min_tokens, max_tokens)
        prompt_hash = tokens.choice_hash(prompt_hash, index)
        if prefill is None:
            rng = tokens.output_rng(self.seed, prompt_hash, request_seed)
            output = tokens.draw_tokens(rng, physics.draw_output_len(p, rng, max_tokens, ignore_eos, min_tokens))
        else:
            output = self._continued(prefill, prompt_hash, base_tokens, given, max_tokens, ignore_eos, min_tokens,
                                     request_seed)
        hashes = tokens.block_hashes(prompt, p.block_size, cache_salt)
        seq = Sequence(self._next_id, n_prompt, hashes, output, max_tokens, index, prompt_hash, share)
        self._next_id += 1
        return seq

    def create_all(self, req: GenRequest) -> list[Sequence]:
        """Every sequence of a request, prompt by prompt, best_of (>= n) of each; raises RequestError. The
        sequences of one prompt share its full blocks (`PromptShare`)."""
        per, size = req.best_of, self.profile.block_size
        seqs: list[Sequence] = []
        for prompt in req.prompts:
            share = PromptShare(len(prompt.tokens) // size * size) if per > 1 else None
            for j in range(per):
                seqs.append(self.create(prompt.tokens, prompt.hash, req.max_tokens, ignore_eos=req.ignore_eos,
                                        min_tokens=req.min_tokens, request_seed=req.seed, prefill=req.prefill,
                                        base_tokens=req.base_tokens, index=j, share=share,
                                        cache_salt=req.cache_salt))
        return seqs

    def _continued(self, prefill: str, prompt_hash: int, base_tokens: int, given: int | None, max_tokens: int,
                   ignore_eos: bool, min_tokens: int, request_seed: int | None) -> list[int]:
        """The output after `prefill`. As a greedy model continues its own answer the same way: when `prefill`
        starts the answer the prompt alone gets (drawn with max_tokens raised by its k tokens, as the request
        that was cut asked), the rest of that answer; otherwise a draw seeded by the prompt and the prefill."""
        p = self.profile
        k = tokens.output_count(prefill)
        if k is not None:
            whole = given + k if given is not None else max(1, min(p.default_max_tokens, p.max_model_len - base_tokens))
            rng = tokens.output_rng(self.seed, prompt_hash, request_seed)
            n_out = physics.draw_output_len(p, rng, whole, ignore_eos, min(min_tokens + k, whole))
            answer = tokens.draw_tokens(rng, n_out)
            if k <= n_out and tokens.detokenize(answer[:k]) == prefill:
                return answer[k:k + max_tokens]
        rng = tokens.output_rng(self.seed, tokens.stable_hash(f"{prompt_hash}:{prefill}"), request_seed)
        return tokens.draw_tokens(rng, physics.draw_output_len(p, rng, max_tokens, ignore_eos, min_tokens))

    def enqueue(self, seq: Sequence) -> None:
        """Put a created sequence at the back of the waiting queue."""
        seq.state = SeqState.WAITING
        seq.arrival = self.now()
        self._waiting.append(seq)
        self._n_waiting += 1
        self._wake.set()

    def release(self, seq: Sequence, status: Status, sent_tokens: int) -> RequestRecord:
        """Remove a sequence for good (frees its KV at once) and record it."""
        self._free(seq)
        first, arr = seq.first_token_at, seq.arrival
        rec = RequestRecord(
            seq.id, status, seq.prompt_tokens, seq.cached_tokens, seq.generated, sent_tokens,
            seq.finish_reason if seq.state is SeqState.FINISHED else None, seq.preemptions,
            None if first is None else first - arr,
            None if seq.finished_at is None or first is None else seq.finished_at - arr,
        )
        self.stats.add(rec)
        seq.notify()
        return rec

    def release_all(self, seqs: Seq[Sequence], status: Status, sent_tokens: int) -> RequestRecord:
        """Remove the sequences of one request and record them as one request: its prompts' tokens once each
        (a prompt's siblings share it), every sequence's output, the first token and the last finish."""
        for seq in seqs:
            self._free(seq)
        owners = [s for s in seqs if s.index == 0]
        firsts = [s.first_token_at - s.arrival for s in seqs if s.first_token_at is not None]
        ends = [s.finished_at - s.arrival for s in seqs if s.finished_at is not None and s.first_token_at is not None]
        finished = all(s.state is SeqState.FINISHED for s in seqs)
        rec = RequestRecord(
            seqs[0].id, status, sum(s.prompt_tokens for s in owners), sum(s.cached_tokens for s in owners),
            sum(s.generated for s in seqs), sent_tokens,
            "length" if finished and any(s.finish_reason == "length" for s in seqs) else
            "stop" if finished else None,
            sum(s.preemptions for s in seqs), min(firsts) if firsts else None,
            max(ends) if ends and len(ends) == len(seqs) else None,
        )
        self.stats.add(rec)
        for seq in seqs:
            seq.notify()
        return rec

    def _free(self, seq: Sequence) -> None:
        if seq.state is SeqState.RUNNING:
            del self._running[seq.id]
            self._drop(seq)
        elif seq.state is SeqState.WAITING:
            self._n_waiting -= 1  # the deque entry is skipped lazily
        if seq.state is not SeqState.FINISHED:
            seq.state = SeqState.ABORTED
            seq.finished_at = self.clock

    def _need(self, seq: Sequence) -> int:
        """KV tokens `seq` adds when it starts running (its siblings may hold its prompt's shared blocks)."""
        sh = seq.share
        if sh is None or sh.holders == 0:
            return seq.context_tokens
        return seq.context_tokens - sh.tokens

    def _hold(self, seq: Sequence) -> None:
        self.kv_used += self._need(seq)
        if seq.share is not None:
            seq.share.holders += 1

    def _drop(self, seq: Sequence) -> None:
        sh = seq.share
        if sh is None:
            self.kv_used -= seq.context_tokens
            return
        sh.holders -= 1
        self.kv_used -= seq.context_tokens - (sh.tokens if sh.holders else 0)

    def record_rejection(self, seqs: Sequence | Seq[Sequence]) -> None:
        """Count a created request refused by an injected 500/429 fault (never queued)."""
        group = [seqs] if isinstance(seqs, Sequence) else list(seqs)
        for seq in group:
            seq.state = SeqState.ABORTED
        prompt = sum(s.prompt_tokens for s in group if s.index == 0)
        self.stats.add(RequestRecord(group[0].id, "fault", prompt, 0, 0, 0, None, 0, None, None))

    # -- scheduler ---------------------------------------------------------------------
    def step(self) -> float:
        """Preempt, admit and return the model duration of this step (no tokens yet)."""
        p, running, waiting = self.profile, self._running, self._waiting
        while len(running) > 1 and self.kv_used + len(running) > p.kv_capacity_tokens:
            self._preempt(running[next(reversed(running))])
        prefill = 0
        while waiting and len(running) < p.max_running:
            seq = waiting[0]
            if seq.state is not SeqState.WAITING:
                waiting.popleft()
                continue
            if self.kv_used + len(running) + self._need(seq) + 1 > p.kv_capacity_tokens:
                break
            if not seq.admitted_once:
                seq.cached_tokens = self.prefix_cache.lookup(seq.block_hashes, seq.prompt_tokens)
                if seq.share is not None and seq.share.holders:  # a running sibling holds the prompt's blocks
                    seq.cached_tokens = max(seq.cached_tokens, min(seq.share.tokens, seq.prompt_tokens - 1))
            compute = seq.context_tokens - seq.cached_tokens
            if prefill and prefill + compute > p.max_batched_tokens:
                break
            waiting.popleft()
            self._n_waiting -= 1
            self._admit(seq)
            prefill += compute
        self.stats.steps += 1
        return physics.prefill_s(p, prefill) + physics.decode_s(p, len(running), self.kv_used)

    def emit(self) -> None:
        """Give every running sequence its next token; finish those that are complete."""
        clock, running = self.clock, self._running
        finished: list[Sequence] = []
        for seq in running.values():
            seq.generated += 1
            if seq.first_token_at is None:
                seq.first_token_at = clock
            if seq.generated >= seq.n_out:
                finished.append(seq)
            seq.notify()
        self.kv_used += len(running)
        self.stats.generation_tokens += len(running)
        for seq in finished:
            del running[seq.id]
            self._drop(seq)
            seq.state = SeqState.FINISHED
            seq.finished_at = clock

    def _admit(self, seq: Sequence) -> None:
        seq.state = SeqState.RUNNING
        self._running[seq.id] = seq
        self._hold(seq)
        if not seq.admitted_once:
            seq.admitted_once = True
            self.stats.prompt_tokens += seq.prompt_tokens
            self.prefix_cache.insert(seq.block_hashes)

    def _preempt(self, seq: Sequence) -> None:
        del self._running[seq.id]
        self._drop(seq)
        seq.state = SeqState.WAITING
        seq.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(seq)
        self._n_waiting += 1

    async def run(self) -> None:
        """The real-time scheduler loop: step, sleep the step's duration, emit."""
        loop = asyncio.get_running_loop()
        offset = self._offset = loop.time() - self.clock
        deadline = loop.time()
        while True:
            if not self._running and not self._n_waiting:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                self.clock = max(self.clock, deadline - offset)
            dt = self.step()
            self.clock += dt
            now = loop.time()
            deadline = max(deadline + dt, now - MAX_LAG_S)
            await asyncio.sleep(max(deadline - now, 0.0))
            self.clock = max(self.clock, loop.time() - offset)
            self.emit()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="emulator-engine")

    async def stop(self) -> None:
        task, self._task, self._offset = self._task, None, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def snapshot(self, records: int | None = None) -> dict[str, Any]:
        """JSON-ready stats: counters, live state, prefix cache, faults and records."""
        return {
            **self.stats.counters(),
            "running": self.num_running, "waiting": self.num_waiting,
            "kv_used_tokens": self.kv_used, "kv_capacity_tokens": self.profile.kv_capacity_tokens,
            "prefix_cache_queries": self.prefix_cache.queries,
            "prefix_cache_hits": self.prefix_cache.hits,
            "profile": self.profile.name, "seed": self.seed,
            "faults": self.faults.config.to_dict(), "faults_injected": dict(self.faults.injected),
            "records": self.stats.record_dicts(records),
        }
