"""Issue 37: the emulator serves `n`, prompt lists, token-id prompts, content parts, tools, best_of and logprobs as
vLLM does, and every input it reads changes its answer (real server on loopback, the official openai client)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from gateway.emulator import PROFILES, RunningEmulator, serve_emulator
from gateway.emulator.parse import MEDIA_TOKENS
from gateway.emulator.tokens import output_count

Q = "What does continuous batching buy a serving engine?"


@pytest.fixture
async def emu() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(PROFILES["instant"], seed=5) as running:
        yield running


@pytest.fixture
async def oai(emu: RunningEmulator) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=emu.url + "/v1", api_key="k", max_retries=0, timeout=20)
    yield c
    await c.close()


async def post(emu: RunningEmulator, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """Raw POST: the status and the JSON body, or the list of SSE events of a stream."""
    async with aiohttp.ClientSession() as s, s.post(emu.url + path, json=body) as r:
        raw = await r.read()
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            blocks = [b for b in raw.split(b"\n\n") if b]
            assert all(b.startswith(b"data: ") for b in blocks) and blocks[-1] == b"data: [DONE]"
            return r.status, [orjson.loads(b[6:]) for b in blocks[:-1]]
        return r.status, orjson.loads(raw)


async def chat(emu: RunningEmulator, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    status, body = await post(emu, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 24,
                                                            **extra})
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def answer(body: dict[str, Any]) -> str:
    return str(body["choices"][0]["message"]["content"])


async def test_chat_n_gives_n_distinct_deterministic_choices(oai: openai.AsyncOpenAI) -> None:
    msgs: Any = [{"role": "user", "content": Q}]
    one = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=30)
    many = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=30, n=4)
    again = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=30, n=4)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    texts = [c.message.content or "" for c in many.choices]
    assert len(set(texts)) == 4 and texts == [c.message.content for c in again.choices]
    assert texts[0] == one.choices[0].message.content  # choice 0 is what n = 1 gets
    assert many.usage is not None and one.usage is not None
    assert many.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt is read once
    assert many.usage.completion_tokens == sum(output_count(t) or 0 for t in texts)
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens


async def test_chat_n_streams_interleaved_one_choice_per_chunk(oai: openai.AsyncOpenAI) -> None:
    msgs: Any = [{"role": "user", "content": Q}]
    whole = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=30, n=3)
    stream = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=30, n=3, stream=True,
                                               stream_options={"include_usage": True})
    chunks = [ch async for ch in stream]
    *body, last = chunks
    assert last.choices == [] and last.usage is not None and whole.usage is not None
    assert all(len(ch.choices) == 1 and ch.usage is None for ch in body)
    roles = [ch.choices[0].index for ch in body if ch.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]
    order = [ch.choices[0].index for ch in body if ch.choices[0].delta.content]
    assert any(b < a for a, b in zip(order, order[1:]))  # chunks of different choices interleave
    for c in whole.choices:
        mine = [ch.choices[0] for ch in body if ch.choices[0].index == c.index]
        assert "".join(x.delta.content or "" for x in mine) == c.message.content
        finishes = [x.finish_reason for x in mine if x.finish_reason]
        assert finishes == [c.finish_reason]  # each choice its own finish chunk, once
    assert last.usage.completion_tokens == whole.usage.completion_tokens == len(order)
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens


async def test_completion_prompt_lists_number_choices_as_vllm(oai: openai.AsyncOpenAI) -> None:
    prompts = ["Once upon a time", "The capital of France is", "def fib(n):"]
    singles = [await oai.completions.create(model="m", prompt=p, max_tokens=20) for p in prompts]
    batch = await oai.completions.create(model="m", prompt=prompts, max_tokens=20, n=2)
    assert [c.index for c in batch.choices] == list(range(6))
    for i, single in enumerate(singles):
        assert batch.choices[i * 2].text == single.choices[0].text  # index = prompt_i * n + j
        assert batch.choices[i * 2 + 1].text != single.choices[0].text
    assert batch.usage is not None
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)
    assert batch.usage.completion_tokens == sum(output_count(c.text) or 0 for c in batch.choices)
    stream = await oai.completions.create(model="m", prompt=prompts, max_tokens=20, n=2, stream=True,
                                          stream_options={"include_usage": True})
    chunks = [ch async for ch in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == batch.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == batch.usage.prompt_tokens
    for c in batch.choices:
        mine = [ch.choices[0] for ch in chunks[:-1] if ch.choices[0].index == c.index]
        assert "".join(x.text for x in mine) == c.text
        assert [x.finish_reason for x in mine if x.finish_reason] == [c.finish_reason]


async def test_token_id_prompts_each_id_changes_the_answer(oai: openai.AsyncOpenAI) -> None:
    a = await oai.completions.create(model="m", prompt=[101, 2023, 2003], max_tokens=20)
    b = await oai.completions.create(model="m", prompt=[101, 2023, 2004], max_tokens=20)
    batch = await oai.completions.create(model="m", prompt=[[101, 2023, 2003], [7, 7, 7, 42]], max_tokens=20)
    assert a.choices[0].text != b.choices[0].text
    assert a.usage is not None and a.usage.prompt_tokens == 3
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == a.choices[0].text
    assert batch.choices[1].text != a.choices[0].text
    assert batch.usage is not None and batch.usage.prompt_tokens == 7


async def test_media_parts_count_and_change_the_answer(emu: RunningEmulator) -> None:
    def image(url: str, text: str = "What is in this picture?") -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "text", "text": text},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG one").decode()
    png2 = "data:image/png;base64," + base64.b64encode(b"\x89PNG two").decode()
    text_only = await chat(emu, [{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}])
    first, second = await chat(emu, image(png)), await chat(emu, image(png2))
    remote = await chat(emu, image("https://example.com/cat.jpg"))
    assert len({answer(text_only), answer(first), answer(second), answer(remote)}) == 4
    assert answer(await chat(emu, image(png))) == answer(first)  # deterministic
    assert first["usage"]["prompt_tokens"] == text_only["usage"]["prompt_tokens"] + MEDIA_TOKENS
    two = await chat(emu, [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png}}, {"type": "image_url", "image_url": {"url": png}}]}])
    assert two["usage"]["prompt_tokens"] >= 2 * MEDIA_TOKENS
    low = await chat(emu, [{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": png, "detail": "low"}}]}])
    assert answer(low) != answer(first)

    def audio(data: bytes) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "text", "text": "Transcribe"}, {
            "type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}]}]
    one, other = await chat(emu, audio(b"RIFF one")), await chat(emu, audio(b"RIFF two"))
    assert answer(one) != answer(other)
    assert one["usage"]["prompt_tokens"] > MEDIA_TOKENS


async def test_tools_calls_and_roles_are_read(emu: RunningEmulator) -> None:
    user = [{"role": "user", "content": "Weather in Paris?"}]
    fn: dict[str, Any] = {"name": "get_weather", "description": "Current weather " * 20,
                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    tool = {"type": "function", "function": fn}
    other_tool = {"type": "function", "function": {**fn, "name": "get_forecast"}}
    plain, with_tool = await chat(emu, user), await chat(emu, user, tools=[tool])
    renamed = await chat(emu, user, tools=[other_tool])
    assert len({answer(plain), answer(with_tool), answer(renamed)}) == 3
    assert with_tool["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 40  # the definition is read

    def turn(args: str, result: str) -> list[dict[str, Any]]:
        return [*user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]
    base = await chat(emu, turn('{"city": "Paris"}', "18C"), tools=[tool])
    other_args = await chat(emu, turn('{"city": "Lyon"}', "18C"), tools=[tool])
    other_result = await chat(emu, turn('{"city": "Paris"}', "25C"), tools=[tool])
    assert len({answer(base), answer(other_args), answer(other_result)}) == 3
    long_args = await chat(emu, turn(orjson.dumps({"city": "Paris " * 200}).decode(), "18C"), tools=[tool])
    assert long_args["usage"]["prompt_tokens"] > base["usage"]["prompt_tokens"] + 150
    as_user = await chat(emu, [{"role": "user", "content": "Tell me a story."}])
    as_assistant = await chat(emu, [{"role": "assistant", "content": "Tell me a story."}])
    assert answer(as_user) != answer(as_assistant)
    named = await chat(emu, [{"role": "user", "content": "Tell me a story.", "name": "bob"}])
    assert answer(named) != answer(as_user)


async def test_sampling_parameters_change_the_answer_and_seed_repeats_it(emu: RunningEmulator) -> None:
    user = [{"role": "user", "content": Q}]
    base = answer(await chat(emu, user))
    seen = {base}
    for extra in ({"temperature": 0}, {"temperature": 0.7}, {"top_p": 0.5}, {"stop": ["."]},
                  {"logit_bias": {"42": 5}}, {"seed": 1}, {"seed": 2},
                  {"response_format": {"type": "json_object"}}):
        got = answer(await chat(emu, user, **extra))
        assert got not in seen, extra
        seen.add(got)
        assert answer(await chat(emu, user, **extra)) == got  # the same request, the same answer
    # what changes only the length keeps the text's start
    short = answer(await chat(emu, user, max_tokens=3))
    assert base.startswith(short)


async def test_best_of_generates_more_and_returns_the_best(emu: RunningEmulator) -> None:
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 12, "logprobs": 0}
    before = emu.engine.stats.generation_tokens
    status, best = await post(emu, "/v1/completions", {**body, "best_of": 3})
    assert status == 200 and len(best["choices"]) == 1
    generated = emu.engine.stats.generation_tokens - before
    _, all3 = await post(emu, "/v1/completions", {**body, "n": 3})
    scores = {c["text"]: sum(c["logprobs"]["token_logprobs"]) for c in all3["choices"]}
    assert best["choices"][0]["text"] == max(scores, key=scores.__getitem__)
    assert generated == all3["usage"]["completion_tokens"]  # the engine generated all three
    assert best["usage"]["completion_tokens"] == len(best["choices"][0]["logprobs"]["tokens"])
    status, events = await post(emu, "/v1/completions", {**body, "best_of": 3, "stream": True})
    assert status == 200 and len(events) == 1 and events[0]["choices"] == best["choices"]  # vLLM: one event
    status, err = await post(emu, "/v1/completions", {**body, "best_of": 2, "n": 3})
    assert status == 400 and err["error"]["param"] == "best_of"


async def test_chat_logprobs_shape(oai: openai.AsyncOpenAI) -> None:
    msgs: Any = [{"role": "user", "content": Q}]
    r = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=15, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    assert c.logprobs is not None and c.logprobs.content is not None and r.usage is not None
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens and "".join(t.token for t in content) == c.message.content
    for t in content:
        assert t.logprob <= 0 and t.bytes == list(t.token.encode()) and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
        lps = [x.logprob for x in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and len({x.token for x in t.top_logprobs}) == 3
    plain = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=15)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == c.message.content
    stream = await oai.chat.completions.create(model="m", messages=msgs, max_tokens=15, logprobs=True,
                                               top_logprobs=3, stream=True)
    streamed = [t for ch in [x async for x in stream] if ch.choices and ch.choices[0].logprobs
                for t in ch.choices[0].logprobs.content or []]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]


async def test_completion_logprobs_shape(oai: openai.AsyncOpenAI) -> None:
    r = await oai.completions.create(model="m", prompt="Once upon a time", max_tokens=10, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.text_offset is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, own, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and top[tok] == own == max(top.values())
    stream = await oai.completions.create(model="m", prompt="Once upon a time", max_tokens=10, logprobs=2,
                                          stream=True)
    chunks = [ch async for ch in stream]
    offsets = [o for ch in chunks if ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset or []]
    assert offsets == lp.text_offset


@pytest.mark.parametrize("extra", [
    {"n": 0}, {"n": 129}, {"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2},
    {"messages": [{"role": "user", "content": [{"type": "hologram", "hologram": {}}]}]},
    {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
])
async def test_bad_shapes_get_400(emu: RunningEmulator, extra: dict[str, Any]) -> None:
    status, body = await post(emu, "/v1/chat/completions",
                              {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt", [[], [[]], [1, "a"], [-1, 2], [["a"]]])
async def test_bad_prompts_get_400(emu: RunningEmulator, prompt: Any) -> None:
    status, body = await post(emu, "/v1/completions", {"model": "m", "prompt": prompt})
    assert status == 400 and body["error"]["param"] == "prompt"


async def test_many_choices_are_one_request_in_the_stats(emu: RunningEmulator) -> None:
    status, body = await post(emu, "/v1/completions", {"model": "m", "prompt": ["a b c", "d e f g"], "n": 3,
                                                       "max_tokens": 8})
    assert status == 200
    [rec] = list(emu.engine.stats.records)
    assert rec.status == "completed" and rec.prompt_tokens == body["usage"]["prompt_tokens"] == 7
    assert rec.completion_tokens == rec.sent_tokens == body["usage"]["completion_tokens"]
    assert emu.engine.num_running == 0 and emu.engine.kv_used == 0


async def test_a_client_leaving_a_many_choice_stream_frees_every_sequence() -> None:
    import asyncio
    import dataclasses

    slow = dataclasses.replace(PROFILES["instant"], name="slow", tpot_1_s=0.01)
    async with serve_emulator(slow) as e, aiohttp.ClientSession() as s:
        body = {"model": "m", "prompt": ["a b", "c d"], "n": 3, "max_tokens": 500, "ignore_eos": True,
                "stream": True}
        async with s.post(e.url + "/v1/completions", json=body) as r:
            await r.content.readline()
            assert e.engine.num_running == 6  # two prompts x three choices decode together
        for _ in range(300):
            if e.engine.stats.cancelled:
                break
            await asyncio.sleep(0.01)
        [rec] = list(e.engine.stats.records)
        assert rec.status == "cancelled" and 0 < rec.completion_tokens < 3000
        assert e.engine.num_running == 0 and e.engine.kv_used == 0


async def test_faults_apply_to_many_choices(emu: RunningEmulator) -> None:
    from gateway.emulator import FaultConfig

    body = {"model": "m", "messages": [{"role": "user", "content": Q}], "n": 2, "max_tokens": 20,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    emu.engine.faults.config = FaultConfig(omit_usage=True, omit_finish_reason=True)
    status, events = await post(emu, "/v1/chat/completions", body)
    assert status == 200 and all(e["choices"] and e["choices"][0]["finish_reason"] is None for e in events)
    emu.engine.faults.config = FaultConfig(disconnect_after_tokens=5)
    async with aiohttp.ClientSession() as s, s.post(emu.url + "/v1/chat/completions", json=body) as r:
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    emu.engine.faults.config = FaultConfig(error_rate=1.0)
    status, err = await post(emu, "/v1/chat/completions", body)
    assert status == 500 and err["error"]["type"] == "server_error"
    assert [r.status for r in emu.engine.stats.records] == ["completed", "fault", "fault"]
    assert emu.engine.num_running == 0 and emu.engine.kv_used == 0
