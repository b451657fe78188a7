"""The emulator as a real server on loopback, driven by the official openai client and raw HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import aiohttp
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from gateway.emulator import PROFILES, FaultConfig, RunningEmulator, serve_emulator

SLOW = dataclasses.replace(PROFILES["instant"], name="slow", tpot_1_s=0.01)
MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me about continuous batching."}]


@pytest.fixture
async def emu() -> AsyncIterator[RunningEmulator]:
    async with serve_emulator(PROFILES["instant"], seed=11) as running:
        yield running


def client(emu: RunningEmulator, timeout: float = 10.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=emu.url + "/v1", api_key="k", max_retries=0, timeout=timeout)


async def until(cond: object, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_chat_stream_matches_non_stream_and_reports_usage(emu: RunningEmulator) -> None:
    c = client(emu)
    whole = await c.chat.completions.create(model="any-model", messages=MSGS, max_tokens=40)
    stream = await c.chat.completions.create(
        model="any-model", messages=MSGS, max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [ch async for ch in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert "".join(content) == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and whole.usage is not None
    assert usage.completion_tokens == len(content) == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 5
    assert whole.model == "any-model" and whole.object == "chat.completion"
    await c.close()


async def test_completions_stream_and_length_finish(emu: RunningEmulator) -> None:
    c = client(emu)
    whole = await c.completions.create(model="m", prompt="Once upon a time", max_tokens=7,
                                       extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length" and whole.usage is not None
    assert whole.usage.completion_tokens == 7 and whole.object == "text_completion"
    stream = await c.completions.create(model="m", prompt="Once upon a time", max_tokens=7,
                                        stream=True, extra_body={"ignore_eos": True})
    chunks = [ch async for ch in stream]
    texts = [ch.choices[0].text for ch in chunks if ch.choices[0].text]
    assert len(texts) == 7 and "".join(texts) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chunks)
    await c.close()


async def test_raw_sse_framing_models_health_metrics(emu: RunningEmulator) -> None:
    body = {"model": "m", "messages": MSGS, "stream": True, "max_tokens": 3, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(emu.url + "/v1/chat/completions", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            raw = await r.read()
        events = raw.split(b"\n\n")
        assert events[-1] == b"" and events[-2] == b"data: [DONE]"
        assert all(e.startswith(b"data: {") for e in events[:-2]) and len(events) == 2 + 5
        async with s.get(emu.url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "emulator-instant"
        async with s.get(emu.url + "/health") as r:
            assert r.status == 200
        long_prompt = " ".join(f"w{i}" for i in range(200))
        for _ in range(2):
            async with s.post(emu.url + "/v1/completions", json={"model": "m", "prompt": long_prompt}) as r:
                assert r.status == 200
        async with s.get(emu.url + "/metrics") as r:
            text = await r.text()
    metrics = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines() if not line.startswith("#")}
    assert metrics["vllm:num_requests_running"] == 0 and metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:gpu_cache_usage_perc"] == 0
    assert metrics["vllm:prefix_cache_queries_total"] >= 400
    assert metrics["vllm:prefix_cache_hits_total"] == 192  # 12 full blocks of the repeated 200


async def test_stats_records_reconcile_with_usage(emu: RunningEmulator) -> None:
    c = client(emu)
    results = await asyncio.gather(*[
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"q {i}"}])
        for i in range(20)
    ])
    async with aiohttp.ClientSession() as s, s.get(emu.url + "/emulator/stats") as r:
        stats = await r.json()
    assert (stats["received"], stats["completed"], stats["running"], stats["waiting"]) == (20, 20, 0, 0)
    assert sum(rec["completion_tokens"] for rec in stats["records"]) == sum(
        res.usage.completion_tokens for res in results if res.usage)
    assert sum(rec["prompt_tokens"] for rec in stats["records"]) == sum(
        res.usage.prompt_tokens for res in results if res.usage)
    await c.close()


async def test_same_seed_gives_same_text_across_servers() -> None:
    texts = []
    for _ in range(2):
        async with serve_emulator(PROFILES["instant"], seed=5) as e:
            c = client(e)
            r = await c.chat.completions.create(model="m", messages=MSGS)
            texts.append(r.choices[0].message.content)
            await c.close()
    assert texts[0] == texts[1] and texts[0]


async def test_client_disconnect_mid_stream_cancels_sequence() -> None:
    async with serve_emulator(SLOW) as e:
        c = client(e)
        stream = await c.chat.completions.create(
            model="m", messages=MSGS, max_tokens=5000, stream=True, extra_body={"ignore_eos": True},
        )
        got = 0
        async for ch in stream:
            got += bool(ch.choices and ch.choices[0].delta.content)
            if got == 3:
                break
        assert e.engine.num_running == 1
        await stream.close()
        await until(lambda: e.engine.stats.cancelled == 1)
        assert e.engine.num_running == 0 and e.engine.kv_used == 0
        rec = e.engine.stats.records[-1]
        assert rec.status == "cancelled" and 3 <= rec.sent_tokens < 5000
        await c.close()


async def test_client_timeout_on_non_stream_cancels_sequence() -> None:
    async with serve_emulator(SLOW) as e:
        c = client(e, timeout=0.2)
        with pytest.raises(openai.APITimeoutError):
            await c.chat.completions.create(model="m", messages=MSGS, max_tokens=5000,
                                            extra_body={"ignore_eos": True})
        await until(lambda: e.engine.stats.cancelled == 1)
        assert e.engine.num_running == 0 and e.engine.kv_used == 0
        await c.close()


async def test_realtime_decode_and_queueing() -> None:
    profile = dataclasses.replace(SLOW, tpot_1_s=0.02, max_running=1)
    async with serve_emulator(profile) as e:
        c = client(e)

        async def timed() -> float:
            t = time.perf_counter()
            await c.completions.create(model="m", prompt="x y z", max_tokens=10, extra_body={"ignore_eos": True})
            return time.perf_counter() - t

        durations = sorted(await asyncio.gather(timed(), timed()))
        assert durations[0] >= 0.18  # 10 decode steps of 20 ms
        assert durations[1] >= 0.36  # queued behind the first: max_running=1
        await c.close()


async def test_bad_requests_get_openai_errors(emu: RunningEmulator) -> None:
    c = client(emu)
    with pytest.raises(openai.BadRequestError) as info:
        await c.chat.completions.create(model="m", messages=[])
    assert info.value.status_code == 400
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await c.completions.create(model="m", prompt="x", max_tokens=1 << 21)
    assert emu.engine.stats.rejected == 2
    await c.close()


async def set_faults(emu: RunningEmulator, **fields: object) -> None:
    async with aiohttp.ClientSession() as s, s.post(emu.url + "/emulator/faults", json=fields) as r:
        assert r.status == 200, await r.text()


async def test_fault_error_and_rate_limit(emu: RunningEmulator) -> None:
    c = client(emu)
    await set_faults(emu, error_rate=1.0)
    with pytest.raises(openai.InternalServerError) as err:
        await c.chat.completions.create(model="m", messages=MSGS)
    assert err.value.status_code == 500 and "emulated" in str(err.value.message)
    await set_faults(emu, rate_limit_rate=1.0, retry_after_s=2)
    with pytest.raises(openai.RateLimitError) as limited:
        await c.chat.completions.create(model="m", messages=MSGS, stream=True)
    assert limited.value.response.headers["Retry-After"] == "2"
    assert emu.engine.stats.failed_fault == 2 and emu.engine.faults.injected["rate_limit"] == 1
    await set_faults(emu)
    assert (await c.chat.completions.create(model="m", messages=MSGS)).choices
    async with aiohttp.ClientSession() as s, s.post(emu.url + "/emulator/faults", json={"bogus": 1}) as r:
        assert r.status == 400
    await c.close()


async def test_fault_stall_delays_first_token(emu: RunningEmulator) -> None:
    await set_faults(emu, stall_s=0.3)
    c = client(emu)
    t = time.perf_counter()
    stream = await c.chat.completions.create(model="m", messages=MSGS, stream=True)
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            break
    assert time.perf_counter() - t >= 0.3
    await stream.close()
    await c.close()


async def test_fault_disconnect_after_tokens(emu: RunningEmulator) -> None:
    await set_faults(emu, disconnect_after_tokens=3)
    c = client(emu)
    got = []
    with pytest.raises(openai.APIError):
        stream = await c.chat.completions.create(
            model="m", messages=MSGS, max_tokens=20, stream=True, extra_body={"ignore_eos": True},
        )
        async for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                got.append(ch.choices[0].delta.content)
    assert len(got) == 3
    with pytest.raises(openai.APIConnectionError):
        await c.chat.completions.create(model="m", messages=MSGS, max_tokens=20,
                                        extra_body={"ignore_eos": True})
    await until(lambda: emu.engine.stats.failed_fault == 2)
    assert emu.engine.num_running == 0 and emu.engine.kv_used == 0
    assert emu.engine.stats.records[-1].status == "fault"
    await c.close()


async def test_fault_malformed_sse(emu: RunningEmulator) -> None:
    await set_faults(emu, malformed_sse=True)
    body = {"model": "m", "messages": MSGS, "stream": True, "max_tokens": 4, "ignore_eos": True}
    async with aiohttp.ClientSession() as s, s.post(emu.url + "/v1/chat/completions", json=body) as r:
        events = (await r.read()).split(b"\n\n")
    bad = [e for e in events[:-1] if not e.startswith(b"data: [DONE]") and not _is_json(e[6:])]
    assert len(bad) == 1
    c = client(emu)
    with pytest.raises(ValueError):  # json.JSONDecodeError from the SDK's SSE decoder
        stream = await c.chat.completions.create(model="m", messages=MSGS, stream=True)
        async for _ in stream:
            pass
    await c.close()


def _is_json(raw: bytes) -> bool:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return True
