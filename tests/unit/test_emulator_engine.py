"""Emulator engine physics, driven on the model clock (no sleeping, no wall-time flakiness)."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.emulator import PROFILES, Engine, Profile, RequestError
from gateway.emulator.physics import decode_s, prefill_s
from gateway.emulator.sequence import Sequence, SeqState
from gateway.emulator.tokens import stable_hash

BASE = dataclasses.replace(
    PROFILES["fp16"], name="test", prefill_tps=1000.0, tpot_1_s=0.01, batch_slope=0.1,
    kv_read_s_per_token=0.0, max_running=8, max_batched_tokens=100_000,
    kv_capacity_tokens=100_000, max_model_len=10_000, prefix_cache_tokens=10_000,
)


def prompt(n: int, tag: str = "p") -> list[str]:
    """n distinct tokens (distinct per tag, so prompts do not share prefix blocks)."""
    return [f"{tag}{i}" for i in range(n)]


def submit(engine: Engine, toks: list[str], max_tokens: int = 10, ignore_eos: bool = True,
           seed: int | None = None) -> Sequence:
    seq = engine.create(toks, stable_hash(" ".join(toks)), max_tokens, ignore_eos=ignore_eos,
                        request_seed=seed)
    engine.enqueue(seq)
    return seq


def run(engine: Engine, seqs: list[Sequence], max_steps: int = 100_000) -> None:
    """Advance the model clock until every sequence is finished."""
    for _ in range(max_steps):
        if all(s.state is SeqState.FINISHED for s in seqs):
            return
        engine.clock += engine.step()
        assert engine.kv_used <= engine.profile.kv_capacity_tokens
        engine.emit()
    raise AssertionError("did not finish")


def ttft(seq: Sequence) -> float:
    assert seq.first_token_at is not None
    return seq.first_token_at - seq.arrival


def tpot(seq: Sequence) -> float:
    assert seq.first_token_at is not None and seq.finished_at is not None
    return (seq.finished_at - seq.first_token_at) / (seq.generated - 1)


def test_ttft_is_prefill_plus_one_decode_step_and_grows_with_prompt() -> None:
    short, long_ = Engine(BASE), Engine(BASE)
    a, b = submit(short, prompt(100)), submit(long_, prompt(2000))
    run(short, [a])
    run(long_, [b])
    assert ttft(a) == pytest.approx(100 / 1000 + 0.01)
    assert ttft(b) == pytest.approx(2000 / 1000 + 0.01)
    assert ttft(b) > ttft(a)


def test_tpot_grows_with_running_sequences() -> None:
    alone, crowded = Engine(BASE), Engine(BASE)
    one = submit(alone, prompt(50), max_tokens=20)
    many = [submit(crowded, prompt(50, f"t{i}"), max_tokens=20) for i in range(8)]
    run(alone, [one])
    run(crowded, many)
    assert tpot(one) == pytest.approx(0.01)
    assert tpot(many[0]) == pytest.approx(0.01 * (1 + 0.1 * 7))
    assert decode_s(BASE, 8, 0) > decode_s(BASE, 1, 0)


def test_kv_reads_slow_decode_with_context() -> None:
    p = dataclasses.replace(BASE, kv_read_s_per_token=1e-6)
    assert decode_s(p, 1, 5000) == pytest.approx(0.01 + 0.005)
    assert prefill_s(p, 0) == 0.0


def test_queueing_when_max_running_is_exceeded() -> None:
    engine = Engine(dataclasses.replace(BASE, max_running=2))
    seqs = [submit(engine, prompt(10, f"q{i}"), max_tokens=5) for i in range(3)]
    engine.clock += engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    run(engine, seqs)
    first_done = min(s.finished_at or 0.0 for s in seqs[:2])
    assert seqs[2].first_token_at is not None and seqs[2].first_token_at > first_done
    assert ttft(seqs[2]) > ttft(seqs[0])


def test_prefix_cache_hit_skips_prefill_and_is_counted() -> None:
    engine = Engine(BASE)
    toks = prompt(1000)
    a = submit(engine, toks)
    run(engine, [a])
    b = submit(engine, toks)
    run(engine, [b])
    assert a.cached_tokens == 0
    assert b.cached_tokens == 992  # 62 full 16-token blocks
    assert ttft(b) == pytest.approx((1000 - 992) / 1000 + 0.01)
    assert engine.prefix_cache.queries == 2000
    assert engine.prefix_cache.hits == 992
    other = submit(engine, prompt(1000, "x"))
    run(engine, [other])
    assert other.cached_tokens == 0


def test_prefix_cache_full_hit_still_recomputes_last_token() -> None:
    engine = Engine(BASE)
    toks = prompt(64)
    run(engine, [submit(engine, toks)])
    again = submit(engine, toks)
    run(engine, [again])
    assert again.cached_tokens == 63


def test_prefix_cache_evicts_least_recently_used() -> None:
    engine = Engine(dataclasses.replace(BASE, prefix_cache_tokens=64))  # 4 blocks
    run(engine, [submit(engine, prompt(64, "a"))])
    run(engine, [submit(engine, prompt(64, "b"))])
    again = submit(engine, prompt(64, "a"))
    run(engine, [again])
    assert again.cached_tokens == 0
    assert len(engine.prefix_cache) == 4


def test_kv_capacity_limits_admission() -> None:
    engine = Engine(dataclasses.replace(BASE, kv_capacity_tokens=200, max_model_len=100))
    seqs = [submit(engine, prompt(90, f"k{i}"), max_tokens=10) for i in range(3)]
    engine.clock += engine.step()
    assert (engine.num_running, engine.num_waiting) == (2, 1)
    assert engine.kv_used == 180
    run(engine, seqs)
    assert all(s.generated == 10 for s in seqs)
    assert engine.kv_used == 0


def test_kv_growth_preempts_the_newest_sequence() -> None:
    engine = Engine(dataclasses.replace(BASE, kv_capacity_tokens=200, max_model_len=110))
    seqs = [submit(engine, prompt(80, f"g{i}"), max_tokens=30) for i in range(2)]
    run(engine, seqs)
    assert engine.stats.preemptions >= 1
    assert seqs[1].preemptions >= 1 and seqs[0].preemptions == 0
    assert all(s.generated == 30 for s in seqs)


def test_same_seed_same_outputs_other_seed_differs() -> None:
    def outputs(seed: int, request_seed: int | None = None) -> list[list[int]]:
        engine = Engine(BASE, seed=seed)
        seqs = [submit(engine, prompt(20, f"d{i}"), max_tokens=200, ignore_eos=False,
                       seed=request_seed) for i in range(5)]
        run(engine, seqs)
        return [s.output_ids for s in seqs]

    assert outputs(7) == outputs(7)
    assert outputs(7) != outputs(8)
    assert outputs(7, request_seed=1) != outputs(7)
    lengths = [len(o) for o in outputs(7)]
    assert len(set(lengths)) > 1 and max(lengths) <= 200


def test_output_length_and_finish_reason() -> None:
    engine = Engine(BASE)
    fixed = submit(engine, prompt(5), max_tokens=7, ignore_eos=True)
    capped = submit(engine, prompt(5, "c"), max_tokens=1, ignore_eos=False)
    run(engine, [fixed, capped])
    assert (fixed.generated, fixed.finish_reason) == (7, "length")
    assert (capped.generated, capped.finish_reason) == (1, "length")
    natural = engine.create(prompt(5, "n"), 1, 5000, ignore_eos=False)
    assert natural.n_out < natural.max_tokens and natural.finish_reason == "stop"


def test_release_frees_kv_and_counts_cancelled() -> None:
    engine = Engine(BASE)
    running = submit(engine, prompt(100), max_tokens=50)
    waiting = engine.create(prompt(10, "w"), 2, 5)
    engine.clock += engine.step()
    engine.emit()
    engine.enqueue(waiting)
    assert engine.kv_used == 101
    rec = engine.release(running, "cancelled", 1)
    engine.release(waiting, "cancelled", 0)
    assert engine.kv_used == 0 and engine.num_running == 0 and engine.num_waiting == 0
    assert engine.stats.cancelled == 2
    assert (rec.prompt_tokens, rec.completion_tokens, rec.sent_tokens) == (100, 1, 1)
    assert engine.step() == 0.0  # the aborted waiting entry is skipped, nothing runs


def test_invalid_requests_raise() -> None:
    engine = Engine(BASE)
    with pytest.raises(RequestError, match="maximum context length"):
        engine.create(prompt(9_990), 1, 20)
    with pytest.raises(RequestError, match="empty"):
        engine.create([], 1, 20)


def test_profiles_are_ordered_by_tier_and_valid() -> None:
    int4, int8, fp16 = PROFILES["int4"], PROFILES["int8"], PROFILES["fp16"]
    assert int4.tpot_1_s < int8.tpot_1_s < fp16.tpot_1_s
    assert 0.025 <= fp16.tpot_1_s <= 0.040 and fp16.prefill_tps >= 2000
    assert PROFILES["instant"].tpot_1_s == 0.0
    with pytest.raises(ValueError):
        Profile(name="bad", model_name="m", prefill_tps=1, tpot_1_s=0, batch_slope=0,
                kv_read_s_per_token=0, max_running=1, max_batched_tokens=1,
                kv_capacity_tokens=10, max_model_len=100, prefix_cache_tokens=0)
