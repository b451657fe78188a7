"""Issue 37, the emulator's engine and parser for several choices: siblings of one prompt share its KV blocks and
its prefill, decode runs over every sequence, and every input the parser reads changes the prompt's hash."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from gateway.emulator import PROFILES, Engine
from gateway.emulator.parse import MEDIA_TOKENS, GenRequest, parse_body
from gateway.emulator.physics import decode_s, prefill_s
from gateway.emulator.sequence import Sequence, SeqState

BASE = dataclasses.replace(
    PROFILES["fp16"], name="test", prefill_tps=1000.0, tpot_1_s=0.01, batch_slope=0.1,
    kv_read_s_per_token=0.0, max_running=64, max_batched_tokens=100_000, block_size=16,
    kv_capacity_tokens=100_000, max_model_len=10_000, prefix_cache_tokens=10_000,
)


def request(body: dict[str, Any], kind: str = "completion") -> GenRequest:
    return parse_body(orjson.dumps({"model": "m", **body}), kind)  # type: ignore[arg-type]


def held(engine: Engine, seqs: list[Sequence]) -> int:
    """The KV the running sequences hold, counted from scratch: shared prompt blocks once per share."""
    running = [s for s in seqs if s.state is SeqState.RUNNING]
    shares = {id(s.share): s.share.tokens for s in running if s.share is not None}
    return sum(s.context_tokens - (s.share.tokens if s.share is not None else 0) for s in running) \
        + sum(shares.values())


def test_n_siblings_share_the_prompt_blocks_and_its_prefill() -> None:
    engine = Engine(BASE)
    words = " ".join(f"w{i}" for i in range(100))  # 100 tokens: 96 in full blocks
    seqs = engine.create_all(request({"prompt": words, "n": 4, "max_tokens": 5, "ignore_eos": True}))
    assert [s.index for s in seqs] == [0, 1, 2, 3] and len({tuple(s.output_ids) for s in seqs}) == 4
    for s in seqs:
        engine.enqueue(s)
    dt = engine.step()
    # the prompt prefilled once; each sibling recomputes only its last partial block
    assert dt == pytest.approx(prefill_s(BASE, 100 + 3 * 4) + decode_s(BASE, 4, engine.kv_used))
    assert engine.kv_used == 96 + 4 * 4 == held(engine, seqs)
    assert [s.cached_tokens for s in seqs] == [0, 96, 96, 96]
    for _ in range(5):
        engine.emit()
        assert engine.kv_used == held(engine, seqs)
        if engine.num_running:
            engine.clock += engine.step()
    assert all(s.state is SeqState.FINISHED for s in seqs) and engine.kv_used == 0
    assert engine.stats.generation_tokens == 20  # decode ran for every sequence


def test_prompt_lists_prefill_every_prompt_and_release_frees_all() -> None:
    engine = Engine(BASE)
    prompts = [" ".join(f"{tag}{i}" for i in range(40)) for tag in "abc"]
    seqs = engine.create_all(request({"prompt": prompts, "n": 2, "max_tokens": 50, "ignore_eos": True}))
    assert len(seqs) == 6 and [s.index for s in seqs] == [0, 1] * 3
    for s in seqs:
        engine.enqueue(s)
    dt = engine.step()
    assert dt == pytest.approx(prefill_s(BASE, 3 * (40 + 8)) + decode_s(BASE, 6, engine.kv_used))
    engine.emit()
    rec = engine.release_all(seqs, "cancelled", 6)
    assert engine.kv_used == 0 and engine.num_running == 0
    assert rec.prompt_tokens == 120 and rec.completion_tokens == 6 and rec.sent_tokens == 6


def test_preemption_keeps_shared_kv_accounting_exact() -> None:
    tight = dataclasses.replace(BASE, kv_capacity_tokens=400, max_model_len=400)
    engine = Engine(tight)
    seqs = engine.create_all(request({"prompt": " ".join(f"x{i}" for i in range(64)), "n": 6, "max_tokens": 80,
                                      "ignore_eos": True}))
    for s in seqs:
        engine.enqueue(s)
    for _ in range(2000):
        if all(s.state is SeqState.FINISHED for s in seqs):
            break
        engine.clock += engine.step()
        assert engine.kv_used == held(engine, seqs) <= tight.kv_capacity_tokens
        engine.emit()
        assert engine.kv_used == held(engine, seqs)
    assert all(s.state is SeqState.FINISHED for s in seqs) and engine.kv_used == 0
    assert engine.stats.preemptions > 0  # the case was tight enough to preempt


def test_choice_zero_is_the_single_answer_and_seeds_differ() -> None:
    engine = Engine(BASE, seed=3)
    req = request({"prompt": "Once upon a time", "n": 3, "max_tokens": 30})
    single = engine.create(req.prompt, req.prompt_hash, 30)
    seqs = engine.create_all(req)
    assert seqs[0].output_ids == single.output_ids and seqs[1].output_ids != seqs[2].output_ids
    seeded = engine.create_all(request({"prompt": "Once upon a time", "n": 3, "max_tokens": 30, "seed": 9}))
    assert [s.output_ids for s in seeded] != [s.output_ids for s in seqs]


CHAT: list[dict[str, Any]] = [{"role": "user", "content": "Describe it."}]
VARIANTS: list[dict[str, Any]] = [
    {"messages": CHAT},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "image_url", "image_url": "https://x/b.png"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "input_image", "image_url": "https://x/c.png"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "video_url", "video_url": {"url": "https://x/a.mp4"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."},
                                               {"type": "file", "file": {"file_data": "JVBERi0x"}}]}]},
    {"messages": [{"role": "system", "content": "Describe it."}]},
    {"messages": [{"role": "assistant", "content": "Describe it."}]},
    {"messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}]},
    {"messages": [{"role": "user", "content": "Describe it.", "name": "ann"}]},
    {"messages": CHAT, "functions": [{"name": "f", "parameters": {}}]},
    {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]},
    {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "g"}}]},
    {"messages": [*CHAT, {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}]},
    {"messages": [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
    {"messages": [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
    {"messages": [*CHAT, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
    {"messages": CHAT, "tool_choice": "required"},
    {"messages": CHAT, "top_k": 5},
    {"messages": CHAT, "stop": "x"},
]


def test_every_input_and_parameter_changes_the_prompt_hash() -> None:
    hashes = [request(body, "chat").prompt_hash for body in VARIANTS]
    assert len(set(hashes)) == len(VARIANTS)
    assert request(VARIANTS[1], "chat").prompt_hash == request(VARIANTS[1], "chat").prompt_hash
    # one input in two shapes is one input
    image = {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
    shapes = [[{"type": "text", "text": "Describe it."}, image],
              [{"type": "input_text", "text": "Describe it."}, {"type": "input_image", "image_url": "https://x/a.png"}]]
    assert len({request({"messages": [{"role": "user", "content": c}]}, "chat").prompt_hash for c in shapes}) == 1
    # what only bounds the length, or asks for the stream, is not part of the answer
    same: list[dict[str, Any]] = [{"messages": CHAT, "max_tokens": 7}, {"messages": CHAT, "stream": True}, {"messages": CHAT, "n": 2},
            {"messages": CHAT, "logprobs": True}, {"messages": CHAT, "user": "u"}]
    assert {request(body, "chat").prompt_hash for body in same} == {hashes[0]}


def test_media_and_tools_count_as_prompt_tokens() -> None:
    plain = len(request(VARIANTS[0], "chat").prompt)
    assert len(request(VARIANTS[1], "chat").prompt) == plain + MEDIA_TOKENS + 0  # text joined, one image
    tools = request({"messages": CHAT, "tools": [{"type": "function", "function": {
        "name": "lookup", "description": "word " * 300}}]}, "chat")
    assert len(tools.prompt) > plain + 300
    comp = request({"prompt": [[1, 2, 3], [4, 5]]})
    assert [p.tokens for p in comp.prompts] == [[1, 2, 3], [4, 5]] and comp.prompt_hash != comp.prompts[1].hash
