"""Issue 32: a stream that breaks after its first byte continues on another replica, and the client sees one
stream. The emulators share a seed (one model behind two replicas) and are greedy: the continued answer must be
the uninterrupted one, token for token. Their fault kills a stream at token K of the answer (a continuation that
starts past K streams on), so whichever replica serves first breaks, and the other one continues."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import aiohttp.web
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.emulator.faults import FaultConfig
from gateway.testing import TEST_API_KEY, gateway_config, tier
from gateway.testing.upstream import chunk, content
from tests.conftest import StartApp, StartEmulator, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
TRIALS = 200
BALANCING = {"retry_budget": {"ratio": 1.0, "min_per_s": 1000}}
EMULATED = "emulator"  # the tier counts tokens as its replicas do: a resume counts the tokens sent with it


def _body(question: str, **extra: object) -> dict:
    return {"model": "t", "messages": [{"role": "user", "content": question}], "max_tokens": 48, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


async def _stream(session: aiohttp.ClientSession, gateway: str, body: dict,
                  path: str = "/v1/chat/completions") -> tuple[int, list[dict], bytes]:
    async with session.post(f"{gateway}{path}", json=body, headers=AUTH) as response:
        raw = await response.read()
    events = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    return response.status, events, raw


def _text(events: list[dict]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


async def _two_replicas(start_emulator: StartEmulator) -> tuple:
    return await start_emulator(seed=7), await start_emulator(seed=7)


async def test_200_streams_cut_at_random_tokens_complete_as_if_never_cut(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)], balancing=BALANCING))
    rng = random.Random(32)
    resumed = 0
    uncut_s = cut_s = 0.0  # the time of the reference streams and of the cut (continued) ones
    async with aiohttp.ClientSession() as session:
        for trial in range(TRIALS):
            body = _body(f"trial {trial}: {rng.random()}", seed=trial)
            for emulator in (a, b):
                emulator.engine.faults.config = FaultConfig()
            began = time.perf_counter()
            status, reference, _ = await _stream(session, gateway, body)
            uncut = time.perf_counter() - began
            whole = _text(reference)
            n = sum(1 for e in reference if e.get("choices") and e["choices"][0]["delta"].get("content"))
            if n < 2:
                continue
            cut = rng.randrange(1, n)
            for emulator in (a, b):
                emulator.engine.faults.config = FaultConfig(disconnect_after_tokens=cut)
            began = time.perf_counter()
            with capture_logs() as logs:
                status, events, raw = await _stream(session, gateway, body)
            uncut_s, cut_s = uncut_s + uncut, cut_s + time.perf_counter() - began
            assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), (trial, cut, raw[-300:])
            assert b'"error"' not in raw
            assert _text(events) == whole, (trial, cut)
            assert len({e["id"] for e in events}) == 1
            finishes = [e["choices"][0]["finish_reason"] for e in events if e.get("choices")
                        and e["choices"][0].get("finish_reason")]
            assert finishes == [reference[-2]["choices"][0]["finish_reason"] if not reference[-1].get("choices")
                                else reference[-1]["choices"][0]["finish_reason"]]
            usages = [e["usage"] for e in events if e.get("usage")]
            assert len(usages) == 1 and usages[0]["completion_tokens"] == n
            line = next(e for e in logs if e["event"] == "request")
            assert line["resumed"] and line["outcome"] == "ok" and len(line["parts"]) == 2
            resumed += 1
    assert resumed >= TRIALS * 0.9  # nearly every answer is long enough to be cut
    # a continuation is one more request to the other replica, not a wait on a timeout: the cut streams together
    # take at most a few times the uninterrupted ones (a ratio, not a wall-clock bound: the machine's load cancels
    # out); a one-second stall per resume would put them far past it
    assert cut_s < 4 * uncut_s + 2.0, (cut_s, uncut_s)


async def test_the_log_line_prices_each_part_and_the_metric_counts_the_resume(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    for emulator in (a, b):
        emulator.engine.faults.config = FaultConfig(disconnect_after_tokens=5)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)]))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, events, _ = await _stream(session, gateway, _body("price me", max_tokens=20, ignore_eos=True))
        async with session.get(f"{gateway}/metrics") as response:
            metrics = await response.text()
    assert status == 200
    line = next(e for e in logs if e["event"] == "request")
    first, second = line["parts"]
    assert (first["completion_tokens"], second["completion_tokens"]) == (5, 15)
    assert second["prompt_tokens"] == first["prompt_tokens"] + 5  # the text sent is part of the second prompt
    assert line["prompt_tokens"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert line["completion_tokens"] == 20 and line["finish_reason"] == "length"
    assert abs(line["cost_usd"] - (first["cost_usd"] + second["cost_usd"])) < 1e-12
    assert {first["replica"], second["replica"]} == {"t-0", "t-1"} and line["backend"] == second["replica"]
    usage = next(e["usage"] for e in events if e.get("usage"))
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (first["prompt_tokens"], 20)  # the client's request
    assert 'gateway_stream_resumes_total{outcome="resumed"} 1.0' in metrics


async def test_no_other_replica_ends_the_stream_with_an_error_saying_so(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    broken = await start_emulator(faults=FaultConfig(disconnect_after_tokens=3))
    gateway = await start_gateway(gateway_config([tier("t", [f"{broken.url}/v1"])]))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, _, raw = await _stream(session, gateway, _body("alone", ignore_eos=True))
    assert status == 200 and b"not resumed: no other replica could take it" in raw
    assert not raw.endswith(b"data: [DONE]\n\n")
    line = next(e for e in logs if e["event"] == "request")
    assert (line["outcome"], line["resumed"], line["completion_tokens"]) == ("upstream_error", False, 3)


async def test_a_request_offering_tools_is_never_resumed(start_emulator: StartEmulator,
                                                         start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=3)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)]))
    async with aiohttp.ClientSession() as session:
        body = _body("tools", ignore_eos=True, tools=[{"type": "function", "function": {"name": "f",
                                                                                        "parameters": {}}}])
        status, _, raw = await _stream(session, gateway, body)
    assert status == 200 and b"not resumed: the request offers tools" in raw


async def test_a_tenant_that_turned_resuming_off_gets_the_error_as_before(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=3)
    config = gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)], policy={"resume": {"enabled": False}})
    gateway = await start_gateway(config)
    async with aiohttp.ClientSession() as session:
        status, _, raw = await _stream(session, gateway, _body("off", ignore_eos=True))
    assert status == 200 and b"upstream_stream_broken" in raw and b"not resumed" not in raw


async def test_the_attempt_limit_holds_when_every_continuation_fails(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a = await start_emulator(seed=7, faults=FaultConfig(disconnect_after_tokens=3))
    failing = [await start_emulator(seed=7, faults=FaultConfig(error_rate=1.0)) for _ in range(3)]
    urls = [f"{a.url}/v1", *(f"{e.url}/v1" for e in failing)]
    config = gateway_config([tier("t", urls)], policy={"resume": {"max_attempts": 2}}, balancing=BALANCING)
    gateway = await start_gateway(config)
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, _, raw = await _stream(session, gateway, _body("limit", ignore_eos=True))
    assert status == 200 and b"not resumed: its attempts are used up" in raw
    tries = [e for e in logs if e["event"] == "resume_attempt_failed"]
    first_failures = [e for e in logs if e["event"] == "upstream_attempt_failed"]
    assert len(tries) == 2, (tries, first_failures)


async def test_anthropic_messages_stream_through_a_resume(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)]))
    body = {"model": "t", "max_tokens": 30, "stream": True, "messages": [{"role": "user", "content": "claude?"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/messages", json=body, headers={"x-api-key": TEST_API_KEY}) as r:
            whole = await r.read()
        a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=4)
        async with session.post(f"{gateway}/v1/messages", json=body, headers={"x-api-key": TEST_API_KEY}) as r:
            cut = await r.read()

    def texts(raw: bytes) -> str:
        return "".join(orjson.loads(line[6:])["delta"]["text"] for line in raw.split(b"\n")
                       if line.startswith(b"data: ") and b'"text_delta"' in line)

    assert texts(cut) == texts(whole) and cut.count(b"event: message_stop") == 1
    assert cut.count(b"event: message_start") == 1 and b"event: error" not in cut


def _quiet_upstream() -> aiohttp.web.Application:
    """Streams the role and two tokens, then sends nothing more (the connection stays open)."""

    async def handler(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        await request.read()
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}])
                             + content(" the") + content(" answer"))
        await asyncio.sleep(30)
        return response

    app = aiohttp.web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def test_a_stream_gone_quiet_resumes_after_the_idle_timeout(
        start_emulator: StartEmulator, start_app: StartApp, start_gateway: StartGateway) -> None:
    quiet = await start_app(_quiet_upstream())
    healthy = await start_emulator()
    config = gateway_config([tier("t", [f"{quiet}/v1", f"{healthy.url}/v1"])], upstream={"read_timeout_s": 0.5})
    gateway = await start_gateway(config)
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, events, raw = await _stream(session, gateway, _body("quiet", ignore_eos=True, max_tokens=6))
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert _text(events).startswith(" the answer") and len(events) >= 6
    resumed = next(e for e in logs if e["event"] == "stream_resumed")
    assert (resumed["reason"], resumed["sent"]) == ("upstream_idle_timeout", 2)


async def test_a_json_answer_that_breaks_off_is_retried_whole_on_the_next_replica(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    """Today's rule for non-streamed requests, unchanged: a reset while reading the answer is the replica's
    failure (`Retry`), the request goes whole to the next replica (`upstream.max_attempts`, the retry budget)."""
    broken = await start_emulator(seed=7, faults=FaultConfig(disconnect_after_tokens=3))
    healthy = await start_emulator(seed=7)
    gateway = await start_gateway(gateway_config([tier("t", [f"{broken.url}/v1", f"{healthy.url}/v1"])]))
    body = {**_body("whole", ignore_eos=True), "stream": False}
    del body["stream_options"]
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
                answer = await response.json()
    assert response.status == 200 and answer["usage"]["completion_tokens"] == 48
    line = next(e for e in logs if e["event"] == "request")
    assert (line["attempts"], line["backend"], line["outcome"], line["resumed"]) == (2, "t-1", "ok", False)


@pytest.mark.parametrize("asks_usage", [True, False])
async def test_a_backend_without_usage_is_counted_for_every_part(
        start_emulator: StartEmulator, start_gateway: StartGateway, asks_usage: bool) -> None:
    """llama.cpp-like backends send no usage: the gateway's own count. The client's usage: its prompt once and all
    20 completion tokens; the log line: each part's prompt (the original prompt, then that prompt plus the 5
    tokens sent)."""
    a, b = await _two_replicas(start_emulator)
    counted = tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer="emulator")
    gateway = await start_gateway(gateway_config([counted]))
    body = _body("count me", max_tokens=20, ignore_eos=True)
    async with aiohttp.ClientSession() as session:
        _, whole, _ = await _stream(session, gateway, body)
        for emulator in (a, b):
            emulator.engine.faults.config = FaultConfig(disconnect_after_tokens=5, omit_usage=True)
        with capture_logs() as logs:
            _, events, _ = await _stream(session, gateway, body if asks_usage else {
                **body, "stream_options": {"include_usage": False}})
    original = next(e["usage"] for e in whole if e.get("usage"))["prompt_tokens"]
    usages = [e["usage"] for e in events if e.get("usage")]
    if asks_usage:
        assert [(u["prompt_tokens"], u["completion_tokens"]) for u in usages] == [(original, 20)]
    else:
        assert usages == []
    line = next(e for e in logs if e["event"] == "request")
    assert line["usage_source"] == "counted" and line["prompt_tokens"] == 2 * original + 5
    assert [(p["prompt_tokens"], p["completion_tokens"]) for p in line["parts"]] == [(original, 5), (original + 5, 15)]


async def test_a_stream_that_lost_only_its_end_is_ended_by_the_gateway(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=10)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)]))
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            status, events, raw = await _stream(session, gateway, _body("ten", max_tokens=10, ignore_eos=True))
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "length"
    assert a.engine.stats.received + b.engine.stats.received == 1  # nothing was asked of the other replica
    line = next(e for e in logs if e["event"] == "request")
    assert (line["completion_tokens"], line["resumed"]) == (10, False)


async def test_responses_stream_through_a_resume(start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    a, b = await _two_replicas(start_emulator)
    gateway = await start_gateway(gateway_config([tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer=EMULATED)]))
    body = {"model": "t", "max_output_tokens": 30, "stream": True, "input": "responses?"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/responses", json=body, headers=AUTH) as r:
            whole = await r.read()
        a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=4)
        async with session.post(f"{gateway}/v1/responses", json=body, headers=AUTH) as r:
            cut = await r.read()

    def texts(raw: bytes) -> str:
        return "".join(orjson.loads(line[6:])["delta"] for line in raw.split(b"\n")
                       if line.startswith(b"data: ") and b'"response.output_text.delta"' in line)

    assert texts(cut) == texts(whole) and len(texts(cut)) > 0
    ends = (b"event: response.completed", b"event: response.incomplete")
    assert [cut.count(end) for end in ends] == [whole.count(end) for end in ends] and sum(map(cut.count, ends)) == 1
    assert cut.count(b"event: response.created") == 1 and b"event: error" not in cut
