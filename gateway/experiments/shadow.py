"""Shadow comparisons: resend a sample of a tier's requests to a reference tier, score the agreement of the
two answers, and keep the pairs (a bounded Redis stream per tenant and a JSONL file).

    sender = ShadowSender(send, AgreementScorer(embedder), PairStore(guard, Path("shadow.jsonl")),
                          pressure=lambda: admission.under_pressure())
    sender.start()                                        # in the app's cleanup_ctx; `await sender.aclose()`
    rule = sender.sample(ctx.tenant, ctx.route.tier.name)       # at routing: keep the answer's text if not None
    sender.submit(ShadowJob(...))                         # when the answer is complete (a finisher)

`submit` never blocks and never raises: a job is dropped when admission is under pressure (checked again
before each send), when the queue is full, or after `aclose`. `send(tier, body)` is the gateway's: it must
run at batch priority, outside the tenant's rate limits and budget, and price the reply. Each pair is
logged as one `shadow` line (its `shadow_cost_usd` is the reference and judge calls' cost, `judge_cost_usd` the
judge's part of it, kept apart from the tenant's request lines; `gateway costs` reports them in its `shadow $`
column: gateway.accounting).

Every sampled request ends in one OUTCOME, counted where it is decided (`ShadowSender.outcome`: the sender's
`stats` and, in the app, `gateway_shadow_requests_total{tenant, from_tier, to_tier, outcome}`); a logged
pair also feeds `gateway_shadow_agreement` and `gateway_shadow_cost_usd_total` (gateway.metrics.ShadowSeries).

Agreement is the cosine of the two answers' sentence embeddings (the MiniLM sentence encoder the gateway
ships, in the app on a low-priority thread of its own: `serving.BackgroundEncoder`; it reads the first 256
tokens of each answer). A `judge` tier, when the rule names one, also grades the candidate against the
reference from 0 to 10 (JUDGE_PROMPT).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args

import numpy as np
import numpy.typing as npt
import orjson
import structlog

from gateway.accounting.logfile import RotatingLogFile
from gateway.config.policies import Shadow
from gateway.tokens import prompt_text

if TYPE_CHECKING:
    from gateway.cache.guard import RedisGuard
    from gateway.config.tenants import TenantPolicy
    from gateway.metrics import ShadowSeries

log = structlog.get_logger("gateway.requests")
Embedding = npt.NDArray[np.float32]
PAIR_PREFIX = "shadow:"
MAX_TEXT_CHARS = 8000  # of the prompt and of each answer, in a stored pair
JUDGE_CHARS = 4000
JUDGE_PROMPT = """You grade a candidate answer against a reference answer to the same request.
Score from 0 to 10 how well the candidate matches the reference in meaning, correctness and completeness
(10: as good as the reference; 0: wrong or unrelated). Reply with the number only.

Request:
{prompt}

Reference answer:
{reference}

Candidate answer:
{candidate}"""
_GRADE = re.compile(r"(?<![\d.])(10|[0-9])(?:\.\d+)?(?![\d])")
# how a sampled request's comparison ended: a pair stored (the reference answered, agreement scored); skipped
# under admission pressure (at routing, at submit or before the send); its answer not one to compare (not
# complete, or from another tier: ShadowTap); dropped on a full queue or after aclose; the reference answered
# an error; the job raised
Outcome = Literal["stored", "skipped_pressure", "not_submitted", "dropped_full", "dropped_closed",
                  "reference_failed", "failed"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


class Embedder(Protocol):
    """What the scorer needs of an embedder (gateway.classifier.embedder.CachedEmbedder)."""

    async def embed_many(self, texts: Sequence[str], *, scope: str) -> tuple[list[Embedding], int]: ...


@dataclass(frozen=True, slots=True)
class ShadowReply:
    """The gateway's answer to a shadow (or judge) call."""

    text: str
    status: int = 200
    cost_usd: float = 0.0
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


Send = Callable[[str, dict[str, Any]], Awaitable[ShadowReply]]


@dataclass(frozen=True, slots=True)
class ShadowJob:
    """A served request to compare: its chat body (after the policy stage), answer and tier."""

    request_id: str
    tenant: str
    rule: Shadow
    body: Mapping[str, Any]
    answer: str
    tier: str
    experiment: str | None = None
    arm: str | None = None
    ts: float | None = None  # when the original request was served (default: when the pair is made)


@dataclass(frozen=True, slots=True)
class ShadowPair:
    """What is stored: the prompt, both answers and their agreement (training labels, issue 22 item 5)."""

    ts: str
    request_id: str
    tenant: str
    experiment: str | None
    arm: str | None
    from_tier: str
    to_tier: str
    prompt: str
    answer: str
    reference: str
    agreement: float | None
    judge_tier: str | None
    judge_score: float | None
    shadow_cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def shadow_body(body: Mapping[str, Any], tier: str) -> dict[str, Any]:
    """The same request for `tier`, not streamed."""
    copy = {key: value for key, value in body.items() if key != "stream_options"}
    copy["model"] = tier
    copy["stream"] = False
    return copy


def judge_body(tier: str, prompt: str, candidate: str, reference: str) -> dict[str, Any]:
    text = JUDGE_PROMPT.format(prompt=prompt[:JUDGE_CHARS], reference=reference[:JUDGE_CHARS],
                               candidate=candidate[:JUDGE_CHARS])
    return {"model": tier, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 8,
            "stream": False}


def parse_grade(text: str) -> float | None:
    """The judge's first number from 0 to 10, scaled to [0, 1]; None when it gave none."""
    match = _GRADE.search(text)
    return None if match is None else int(match[1]) / 10


class AgreementScorer:
    """Cosine similarity of two answers' sentence embeddings, in [-1, 1] (two empty answers agree: 1)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    async def cosine(self, answer: str, reference: str, *, scope: str) -> float:
        """`scope`: whose embedding cache the answers' vectors go to (the tenant's, for a shadow pair)."""
        if not answer.strip() or not reference.strip():
            return 1.0 if answer.strip() == reference.strip() else 0.0
        (a, b), _ = await self.embedder.embed_many([answer, reference], scope=scope)
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        return 0.0 if norm == 0 else max(-1.0, min(1.0, float(np.dot(a, b)) / norm))


def pair_key(tenant: str) -> str:
    """The Redis stream of a tenant's shadow pairs."""
    return PAIR_PREFIX + tenant


PAIRS_MODE = 0o600  # the pairs hold every tenant's prompts and answers: the gateway's user only
PAIRS_MAX_BYTES = 64 * 1024 * 1024
PAIRS_BACKUPS = 7


class PairStore:
    """Pairs in a Redis stream per tenant (`shadow:<tenant>`, trimmed to exactly the rule's max_pairs: shadow
    traffic is a low rate) and/or appended to a JSONL file. A Redis failure loses the pair there, not in the file.

    The file holds every tenant's prompts and answers: it is created 0600 (an older, wider one is narrowed when
    opened) and rotates as the request log does (gateway.accounting.logfile.RotatingLogFile): at `max_bytes`
    to `.1` .. `.<backups>` (the oldest dropped), or, with `daily`, at midnight UTC to `.<date>`; the rotated
    files keep 0600. `gateway train --from-outcomes` reads any of them."""

    def __init__(self, guard: RedisGuard | None, jsonl: Path | None = None, *, timeout_s: float = 0.25,
                 max_bytes: int | None = PAIRS_MAX_BYTES, backups: int = PAIRS_BACKUPS, daily: bool = False) -> None:
        self.guard = guard
        self.jsonl = jsonl
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.backups = backups
        self.daily = daily
        self._file: RotatingLogFile | None = None

    async def add(self, pair: ShadowPair, max_pairs: int) -> bool:
        """Store the pair; True when Redis took it (or there is no Redis)."""
        line = orjson.dumps(pair.to_dict())
        if self.jsonl is not None:
            if self._file is None:
                self._file = RotatingLogFile(self.jsonl, max_bytes=self.max_bytes, backups=self.backups,
                                             daily=self.daily, mode=PAIRS_MODE)
            self._file.write(line + b"\n")
            self._file.flush()
        if self.guard is None:
            return True
        client = self.guard.client
        fields: dict[Any, Any] = {"json": line}

        async def write() -> bool:
            await client.xadd(pair_key(pair.tenant), fields, maxlen=max_pairs, approximate=False)
            return True

        return bool(await self.guard.run("shadow_pair_add", write, self.timeout_s, key=pair_key(pair.tenant)))

    async def recent(self, tenant: str, count: int = 100) -> list[dict[str, Any]]:
        """The tenant's latest pairs in Redis, newest first."""
        if self.guard is None:
            return []
        client = self.guard.client

        async def read() -> list[Any]:
            return list(await client.xrevrange(pair_key(tenant), count=count) or [])

        entries = await self.guard.run("shadow_pair_recent", read, self.timeout_s, key=pair_key(tenant)) or []
        return [orjson.loads(fields[b"json"]) for _, fields in entries]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class ShadowSender:
    """A bounded queue of shadow jobs and `workers` tasks that send, score, store and log them."""

    def __init__(
        self, send: Send, scorer: AgreementScorer, store: PairStore, pressure: Callable[[], bool], *,
        queue_size: int = 64, workers: int = 2, rand: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time, metrics: ShadowSeries | None = None,
    ) -> None:
        self.send = send
        self.scorer = scorer
        self.store = store
        self.pressure = pressure
        self.workers = workers
        self.stats: Counter[str] = Counter()  # the outcomes, and `sampled` and `submitted` on the way
        self.metrics = metrics
        self._rand = rand
        self._clock = clock
        self._queue: asyncio.Queue[ShadowJob] = asyncio.Queue(queue_size)
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def sample(self, tenant: TenantPolicy, tier: str) -> Shadow | None:
        """The tenant's shadow rule when this request, served by `tier`, is to be shadowed (decide at routing,
        so the answer's text is kept); None otherwise. Cheap: no I/O."""
        rule = tenant.shadow
        if rule is None or rule.from_tier != tier or self._closed or self._rand() >= rule.share:
            return None
        if self.pressure():
            self.outcome("skipped_pressure", tenant.name, tier, rule.to_tier)
            return None
        self.stats["sampled"] += 1
        return rule

    def outcome(self, outcome: Outcome, tenant: str, from_tier: str, to_tier: str) -> None:
        """Count how one sampled request's comparison ended (the one place each outcome is recorded)."""
        self.stats[outcome] += 1
        if self.metrics is not None:
            self.metrics.outcome(tenant, from_tier, to_tier, outcome)

    def submit(self, job: ShadowJob) -> bool:
        """Queue the job; False when it was dropped (pressure, full queue, closed). Never blocks."""
        if self._closed:
            self._job_outcome("dropped_closed", job)
            return False
        if self.pressure():
            self._job_outcome("skipped_pressure", job)
            return False
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._job_outcome("dropped_full", job)
            return False
        self.stats["submitted"] += 1
        return True

    def _job_outcome(self, outcome: Outcome, job: ShadowJob) -> None:
        self.outcome(outcome, job.tenant, job.tier, job.rule.to_tier)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        """Start the workers (inside the running event loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]

    async def drain(self) -> None:
        """Wait until every queued job is done (tests, shutdown)."""
        await self._queue.join()

    async def aclose(self) -> None:
        """Stop taking jobs, cancel the workers (jobs in flight are dropped) and close the store."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.store.close()

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            try:
                await self.run(job)
            except Exception as err:  # a worker never dies of one job
                self._job_outcome("failed", job)
                log.warning("shadow_failed", request_id=job.request_id, error=f"{type(err).__name__}: {err}")
            finally:
                self._queue.task_done()

    async def run(self, job: ShadowJob) -> ShadowPair | None:
        """Send, score, store and log one job now (None: skipped under pressure, or the reference failed)."""
        if self.pressure():
            self._job_outcome("skipped_pressure", job)
            return None
        rule = job.rule
        reply = await self.send(rule.to_tier, shadow_body(job.body, rule.to_tier))
        cost = reply.cost_usd
        served = reply.status == 200
        agreement = await self.scorer.cosine(job.answer, reply.text, scope=job.tenant) if served else None
        prompt = prompt_text("chat" if "messages" in job.body else "completions", dict(job.body))
        judge_score, judge_cost = None, 0.0
        if served and rule.judge is not None and not self.pressure():
            graded = await self.send(rule.judge, judge_body(rule.judge, prompt, job.answer, reply.text))
            cost += graded.cost_usd
            judge_cost = graded.cost_usd
            judge_score = parse_grade(graded.text) if graded.status == 200 else None
        ts = datetime.fromtimestamp(job.ts if job.ts is not None else self._clock(), UTC)
        pair = ShadowPair(
            ts.isoformat(timespec="milliseconds"), job.request_id, job.tenant, job.experiment, job.arm,
            job.tier, rule.to_tier, prompt[:MAX_TEXT_CHARS], job.answer[:MAX_TEXT_CHARS],
            reply.text[:MAX_TEXT_CHARS], None if agreement is None else round(agreement, 6), rule.judge,
            judge_score, round(cost, 9),
        )
        log.info("shadow", ts=pair.ts, request_id=job.request_id, tenant=job.tenant, experiment=job.experiment,
                 arm=job.arm, from_tier=job.tier, to_tier=rule.to_tier, status=reply.status,
                 agreement=pair.agreement, judge_tier=rule.judge, judge_score=judge_score,
                 shadow_cost_usd=pair.shadow_cost_usd, judge_cost_usd=round(judge_cost, 9),
                 ttft_ms=reply.ttft_ms, e2e_ms=reply.e2e_ms,
                 prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
        if self.metrics is not None:
            self.metrics.pair(job.tenant, job.tier, rule.to_tier, pair.agreement, pair.shadow_cost_usd)
        if not served:
            self._job_outcome("reference_failed", job)
            return None
        await self.store.add(pair, rule.max_pairs)
        self._job_outcome("stored", job)
        return pair
