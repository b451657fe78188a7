"""gateway.bench.runner's closed and open loops over a fake sender (no network), and client.send_json
against a scripted server: counts, indices, concurrency, think time, schedules, shedding, truncation."""

from __future__ import annotations

import asyncio
import random
import time

import orjson
import pytest
from aiohttp import web

from gateway.bench.client import RequestResult, send_json
from gateway.bench.runner import RunResult, Sender, closed_loop, merge_runs, open_loop, open_session
from tests.conftest import StartApp


class FakeServer:
    """A sender that takes `delay_s` per request and records how many were in flight at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.in_flight, self.most = delay_s, 0, 0
        self.sent: list[int] = []

    async def __call__(self, i: int) -> RequestResult:
        self.sent.append(i)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return RequestResult(True, 200, e2e_s=self.delay_s)


async def test_closed_loop_sends_each_index_once_at_the_concurrency() -> None:
    server = FakeServer(0.01)
    run = await closed_loop(server, 10, 3)
    assert sorted(r.index for r in run.results) == list(range(10)) and sorted(server.sent) == list(range(10))
    assert server.most == 3 and not run.truncated
    assert 0.03 <= run.duration_s < 0.5  # 10 requests of 10 ms, 3 at a time: at least 4 rounds
    assert all(0 <= r.start_s < run.duration_s for r in run.results)


async def test_closed_loop_never_runs_more_workers_than_requests() -> None:
    server = FakeServer(0.01)
    run = await closed_loop(server, 2, 16)
    assert server.most == 2 and len(run.results) == 2
    assert (await closed_loop(server, 0, 4)).results == []


async def test_closed_loop_stops_at_its_duration_and_says_truncated() -> None:
    server = FakeServer(0.05)
    run = await closed_loop(server, 1000, 2, duration_s=0.2)
    assert run.truncated and 6 <= len(run.results) <= 10  # 2 workers x 0.2 s / 0.05 s, give or take one each
    assert all(r.ok for r in run.results) and max(r.start_s for r in run.results) < 0.2
    endless = await closed_loop(FakeServer(0.05), None, 2, duration_s=0.2)
    assert not endless.truncated and 6 <= len(endless.results) <= 10  # no end but the duration: not truncated


async def test_think_time_is_each_workers_own_seeded_pause() -> None:
    rng = random.Random(7 * 100_003)  # worker 0's stream with seed 7
    expected = sum(rng.uniform(0.0, 0.05) for _ in range(5))
    run = await closed_loop(FakeServer(), 5, 1, think_s=0.05, seed=7)
    assert len(run.results) == 5
    assert expected <= run.duration_s < expected + 0.05


async def test_unfinished_requests_are_cancelled_after_the_drain() -> None:
    run = await closed_loop(FakeServer(5.0), 4, 2, duration_s=0.05, drain_s=0.05)
    assert [r.error for r in run.results] == ["unfinished", "unfinished"] and run.duration_s < 1.0


async def test_a_senders_exception_propagates() -> None:
    async def broken(i: int) -> RequestResult:
        raise ValueError(f"request {i} broke")

    with pytest.raises(ValueError, match="request 0 broke"):
        await closed_loop(broken, 3, 1)


async def test_open_loop_sends_on_schedule_whatever_is_in_flight() -> None:
    server = FakeServer(0.2)
    run = await open_loop(server, [0.0, 0.05, 0.1, 9.0], duration_s=0.5)
    starts = sorted((r.index, r.start_s) for r in run.results)
    assert [i for i, _ in starts] == [0, 1, 2] and server.most == 3  # the one at 9 s is past the duration
    for (_, start), offset in zip(starts, (0.0, 0.05, 0.1)):
        assert start == pytest.approx(offset, abs=0.03)
    assert 0.3 <= run.duration_s < 0.6  # the last one sent at 0.1 s ends at 0.3 s


async def test_open_loop_cap_waits_or_sheds() -> None:
    waiting = FakeServer(0.05)
    run = await open_loop(waiting, [0.0, 0.0, 0.0], max_concurrency=1)
    assert waiting.most == 1 and all(r.ok for r in run.results) and run.duration_s >= 0.15
    shedding = FakeServer(0.1)
    run = await open_loop(shedding, [0.0, 0.0, 0.0, 0.2], max_concurrency=1, shed=True)
    by_index = {r.index: r for r in run.results}
    assert by_index[0].ok and by_index[3].ok and shedding.sent == [0, 3]
    assert by_index[1].error == by_index[2].error == "in-flight cap" and not by_index[1].ok


def test_merge_runs_adds_results_and_wall_times() -> None:
    a = RunResult([RequestResult(True)], 1.5, 100.0)
    b = RunResult([RequestResult(False), RequestResult(True)], 2.0, 200.0, truncated=True)
    merged = merge_runs([a, b])
    assert len(merged.results) == 3 and merged.duration_s == 3.5 and merged.started_at == 100.0 and merged.truncated


async def _answer(request: web.Request) -> web.Response:
    mode = request.headers.get("x-mode")
    if mode == "busy":
        return web.json_response({"error": {"message": "slow down"}}, status=429)
    if mode == "empty":
        return web.json_response({"choices": []})
    if mode == "garbage":
        return web.Response(body=b"data: not json\n\n")
    return web.json_response({"choices": [{"message": {"content": "hi"}}],
                              "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
                             headers={"x-gateway-cache": "hit", "x-gateway-tier": "small",
                                      "x-gateway-difficulty": "0.25"})


@pytest.fixture
async def url(start_app: StartApp) -> str:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _answer)
    return f"{await start_app(app)}/v1/chat/completions"


async def test_send_json_reads_the_answer_and_its_headers(url: str) -> None:
    body = orjson.dumps({"model": "m", "messages": []})
    async with open_session(5) as session:
        t0 = time.perf_counter()
        ok = await send_json(session, url, body, {})
        assert ok.ok and ok.status == 200 and ok.error is None and 0 < ok.e2e_s <= time.perf_counter() - t0
        assert (ok.output_tokens, ok.prompt_tokens) == (3, 7) and ok.ttft_s == ok.e2e_s
        assert (ok.cache, ok.tier, ok.difficulty) == ("hit", "small", 0.25)
        busy = await send_json(session, url, body, {"x-mode": "busy"})
        assert not busy.ok and busy.status == 429 and (busy.error or "").startswith("HTTP 429: ")
        assert busy.cache is None and busy.difficulty is None
        empty = await send_json(session, url, body, {"x-mode": "empty"})
        assert not empty.ok and (empty.error or "").startswith("no choices")
        garbage = await send_json(session, url, body, {"x-mode": "garbage"})
        assert not garbage.ok and "JSONDecodeError" in (garbage.error or "")
        refused = await send_json(session, "http://127.0.0.1:9/v1/chat/completions", body, {})
        assert not refused.ok and refused.status == 0 and "ClientConnectorError" in (refused.error or "")


async def test_closed_loop_of_send_json_over_http(url: str) -> None:
    body = orjson.dumps({"model": "m", "messages": []})
    async with open_session(5) as session:

        async def sender(i: int) -> RequestResult:
            return await send_json(session, url, body, {})

        one: Sender = sender
        run = await closed_loop(one, 20, 4)
    assert len(run.results) == 20 and all(r.ok and r.cache == "hit" for r in run.results)
