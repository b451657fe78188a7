"""Shadow comparisons: sampling, the never-blocking queue, pressure, agreement (the shipped MiniLM encoder),
the judge, the bounded pair store (real Redis) and the JSONL sink."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import structlog
from redis.asyncio import Redis

from gateway.cache.guard import RedisGuard
from gateway.config import GatewayConfig
from gateway.config.loader import load_routes
from gateway.config.policies import PolicyConfig, Shadow
from gateway.config.tenants import TenantPolicy
from gateway.experiments.shadow import (
    AgreementScorer, Embedding, PairStore, ShadowJob, ShadowReply, ShadowSender, judge_body, parse_grade, shadow_body,
)

from tests.unit.test_experiments_policy import ROOT

RULE = Shadow.model_validate({"share": 1.0, "from": "small-int4", "to": "large-fp16", "max_pairs": 5})
BODY = {"model": "auto", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the capital of France?"}]}


class Recorder:
    """A `send` that answers from a table and remembers what it was sent."""

    def __init__(self, answers: dict[str, str], delay_s: float = 0.0, status: int = 200) -> None:
        self.answers = answers
        self.delay_s = delay_s
        self.status = status
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, tier: str, body: dict[str, Any]) -> ShadowReply:
        self.calls.append((tier, body))
        await asyncio.sleep(self.delay_s)
        return ShadowReply(self.answers[tier], self.status if tier == RULE.to_tier else 200, cost_usd=0.002,
                           ttft_ms=12.5, e2e_ms=40.0, prompt_tokens=9, completion_tokens=7)


class WordEmbedder:
    """Bag of words: texts sharing words point the same way."""

    async def embed_many(self, texts: Sequence[str], *, scope: str = "") -> tuple[list[Embedding], int]:
        out = []
        for text in texts:
            vector = np.zeros(64, dtype=np.float32)
            for word in text.lower().split():
                vector[int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1
            out.append(vector)
        return out, len(texts)


def tenant(shadow: dict[str, Any] | None) -> TenantPolicy:
    key = hashlib.sha256(b"k").hexdigest()
    data = {"default_tier": "small-int4", "shadow": shadow, "tenants": [{"name": "t", "api_key_sha256": key}]}
    routes = load_routes(ROOT / "routes/emulator.yaml")
    return GatewayConfig.build(routes, PolicyConfig.model_validate(data)).tenants_by_key_hash[key]


def job(answer: str = "Paris is the capital of France.", request_id: str = "r1") -> ShadowJob:
    return ShadowJob(request_id, "t", RULE, BODY, answer, "small-int4", "e", "treatment", ts=1_700_000_000.0)


@pytest.fixture
async def guard(redis_url: str) -> AsyncIterator[RedisGuard]:
    client = Redis.from_url(redis_url)
    yield RedisGuard(client, op_timeout_s=1.0)
    await client.aclose()


def test_the_shadow_request_is_the_same_request_to_the_reference_tier_unstreamed() -> None:
    body = shadow_body(BODY, "large-fp16")
    assert body == {"model": "large-fp16", "stream": False, "max_tokens": 64, "messages": BODY["messages"]}
    assert BODY["model"] == "auto" and "stream_options" in BODY  # the client's body is untouched


@pytest.mark.parametrize(("text", "grade"), [("8", 0.8), ("Score: 10/10", 1.0), ("0", 0.0), (" 7.5 ", 0.7),
                                             ("I'd say 3 out of 10", 0.3), ("no idea", None), ("42", None)])
def test_the_judge_grade_is_its_first_number_from_0_to_10(text: str, grade: float | None) -> None:
    assert parse_grade(text) == grade


def test_the_judge_prompt_holds_both_answers() -> None:
    body = judge_body("medium-int8", "q?", "candidate text", "reference text")
    content = body["messages"][0]["content"]
    assert body["model"] == "medium-int8" and body["temperature"] == 0 and body["stream"] is False
    assert "Candidate answer:\ncandidate text" in content and "Reference answer:\nreference text" in content


def test_sampling_follows_the_rule_the_tier_the_share_and_the_pressure() -> None:
    pressure = [False]
    rolls = iter([0.05, 0.5] * 4)
    sender = ShadowSender(Recorder({}), AgreementScorer(WordEmbedder()), PairStore(None), lambda: pressure[0],
                          rand=lambda: next(rolls))
    sampled = tenant({"share": 0.1, "from": "small-int4", "to": "large-fp16"})
    assert sender.sample(tenant(None), "small-int4") is None
    assert sender.sample(sampled, "medium-int8") is None  # answered by another tier
    assert sender.sample(sampled, "small-int4") == sampled.shadow  # roll 0.05 < 0.1
    assert sender.sample(sampled, "small-int4") is None  # roll 0.5
    pressure[0] = True
    assert sender.sample(sampled, "small-int4") is None
    assert sender.stats["sampled"] == 1 and sender.stats["skipped_pressure"] == 1


async def test_agreement_with_the_shipped_minilm_encoder_separates_paraphrases_from_other_answers() -> None:
    from gateway.classifier.difficulty import sentence_embedder

    embedder = sentence_embedder("CPUExecutionProvider")
    try:
        scorer = AgreementScorer(embedder)
        same = await scorer.cosine("Paris is the capital of France.", "The capital of France is Paris.", scope="t")
        other = await scorer.cosine("Paris is the capital of France.", "Sort the list with sorted(xs, key=len).", scope="t")
    finally:
        embedder.close()
    assert same > 0.9 and other < 0.3
    assert await scorer.cosine("", "", scope="t") == 1.0 and await scorer.cosine("text", " ", scope="t") == 0.0


async def test_a_pair_is_scored_judged_stored_in_a_bounded_stream_and_the_jsonl_and_logged(
    guard: RedisGuard, tmp_path: Path,
) -> None:
    rule = RULE.model_copy(update={"judge": "medium-int8"})
    send = Recorder({"large-fp16": "Paris is the capital city of France.", "medium-int8": "9"})
    store = PairStore(guard, tmp_path / "pairs" / "shadow.jsonl")
    sender = ShadowSender(send, AgreementScorer(WordEmbedder()), store, lambda: False)
    with structlog.testing.capture_logs() as logs:
        pair = await sender.run(ShadowJob("r1", "t", rule, BODY, "Paris is the capital of France.", "small-int4",
                                          "e", "treatment", ts=1_700_000_000.0))
    assert pair is not None and pair.agreement is not None and 0.8 < pair.agreement < 1.0
    assert (pair.judge_score, pair.shadow_cost_usd, pair.prompt) == (0.9, 0.004, "What is the capital of France?")
    assert [tier for tier, _ in send.calls] == ["large-fp16", "medium-int8"]
    (line,) = [entry for entry in logs if entry["event"] == "shadow"]
    assert line == {"event": "shadow", "log_level": "info", "ts": "2023-11-14T22:13:20.000+00:00",
                    "request_id": "r1", "tenant": "t", "experiment": "e", "arm": "treatment",
                    "from_tier": "small-int4", "to_tier": "large-fp16", "status": 200,
                    "agreement": pair.agreement, "judge_tier": "medium-int8", "judge_score": 0.9,
                    "shadow_cost_usd": 0.004, "judge_cost_usd": 0.002, "ttft_ms": 12.5, "e2e_ms": 40.0, "prompt_tokens": 9,
                    "completion_tokens": 7}
    for i in range(2, 12):
        await sender.run(ShadowJob(f"r{i}", "t", rule, BODY, "Lyon", "small-int4"))
    stored = await store.recent("t", count=100)
    assert len(stored) == 5 and stored[0]["request_id"] == "r11"  # MAXLEN 5: the newest five
    store.close()
    lines = [orjson.loads(line) for line in (tmp_path / "pairs" / "shadow.jsonl").read_bytes().splitlines()]
    assert len(lines) == 11 and lines[0]["reference"] == "Paris is the capital city of France."


async def test_submit_never_blocks_drops_when_full_or_under_pressure_and_a_failed_reference_is_not_stored(
    guard: RedisGuard,
) -> None:
    pressure = [False]
    send = Recorder({"large-fp16": "slow answer"}, delay_s=0.05)
    store = PairStore(guard)
    sender = ShadowSender(send, AgreementScorer(WordEmbedder()), store, lambda: pressure[0], queue_size=2, workers=1)
    sender.start()
    start = time.perf_counter()
    accepted = [sender.submit(job(request_id=f"r{i}")) for i in range(5)]
    assert send.calls == []  # submit returned without running a send (it is synchronous: it cannot wait)
    assert time.perf_counter() - start < 1.0  # did not block (each send takes 50 ms)
    assert accepted == [True, True, False, False, False] and sender.stats["dropped_full"] == 3
    await sender.drain()
    assert sender.stats["stored"] == 2 and len(await store.recent("t")) == 2
    pressure[0] = True
    assert sender.submit(job(request_id="r9")) is False
    pressure[0] = False
    sender.submit(job(request_id="r10"))
    pressure[0] = True  # pressure arrives while the job waits: it is skipped before sending
    await sender.drain()
    assert len(send.calls) == 2 and sender.stats["skipped_pressure"] == 2
    pressure[0] = False
    send.status = 503
    sender.submit(job(request_id="r11"))
    await sender.drain()
    assert sender.stats["reference_failed"] == 1 and len(await store.recent("t")) == 2
    await sender.aclose()
    assert sender.submit(job()) is False and sender.stats["dropped_closed"] == 1


async def test_the_pairs_file_is_private_and_rotates_like_the_request_log(tmp_path: Path) -> None:
    """Issue 37: the shadow-pairs file (every tenant's prompts and answers) was world-readable and never rotated."""
    import os
    import stat

    path = tmp_path / "pairs" / "shadow.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"")
    path.chmod(0o644)  # a file made before the fix: narrowed when opened
    old_umask = os.umask(0o022)
    try:
        store = PairStore(None, path, max_bytes=1500, backups=2)
        sender = ShadowSender(Recorder({"large-fp16": "Paris " * 40}), AgreementScorer(WordEmbedder()), store,
                              lambda: False)
        for i in range(12):
            await sender.run(ShadowJob(f"r{i}", "t", RULE, BODY, "Lyon " * 40, "small-int4"))
            if i == 0:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the older 0644 file, narrowed
        store.close()
    finally:
        os.umask(old_umask)
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["shadow.jsonl", "shadow.jsonl.1", "shadow.jsonl.2"]  # rotated, two backups kept
    for name in files:
        mode = stat.S_IMODE((path.parent / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))
    assert all(len(p.read_bytes()) <= 1500 + 1000 for p in path.parent.iterdir())
