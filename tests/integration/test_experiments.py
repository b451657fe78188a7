"""Issue 22 end to end, on emulator tiers whose profiles differ: an experiment's arms, the report's verdict,
sticky assignment, shadow comparisons (never changing the client's answer, stopping under admission
pressure, logged with their cost, counted in /metrics as the log lines say) and feedback (tenant-checked,
stored, logged)."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict
from redis.asyncio import Redis
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Tier
from gateway.emulator.faults import FaultConfig
from gateway.experiments.cli import run_experiments
from gateway.experiments.shadow import OUTCOMES
from gateway.metrics import AGREEMENT_BUCKETS
from gateway.state import GATEWAY, Gateway
from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
OTHER_KEY, OTHER_TENANT = "sk-other", "other-tenant"
TENANTS = [{"name": TEST_TENANT, "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()},
           {"name": OTHER_TENANT, "api_key_sha256": hashlib.sha256(OTHER_KEY.encode()).hexdigest()}]
SHADOW = {"share": 1.0, "from": "small", "to": "large"}


async def chat(session: aiohttp.ClientSession, url: str, prompt: str, *, key: str = TEST_API_KEY,
               **body: Any) -> tuple[int, CIMultiDict[str], str]:
    """(status, headers, the answer's text: the stream's content joined, or the message's)."""
    payload = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, **body}
    async with session.post(f"{url}/v1/chat/completions", json=payload,
                            headers={"Authorization": f"Bearer {key}"}) as response:
        raw = await response.read()
        if response.status != 200:
            return response.status, CIMultiDict(response.headers), raw.decode()
        if not body.get("stream"):
            return 200, CIMultiDict(response.headers), orjson.loads(raw)["choices"][0]["message"]["content"]
        parts = []
        for line in raw.decode().splitlines():
            if line.startswith("data: {"):
                choices = orjson.loads(line[6:])["choices"]
                parts += [c["delta"].get("content") or "" for c in choices]
        return 200, CIMultiDict(response.headers), "".join(parts)


async def gather_bounded(calls: Sequence[Callable[[], Any]], concurrency: int) -> list[Any]:
    gate = asyncio.Semaphore(concurrency)

    async def one(call: Callable[[], Any]) -> Any:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(call) for call in calls)))


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def shadows_done(gateway: Gateway, logs: Sequence[Mapping[str, Any]], requests: int) -> None:
    """Every request's log line is written (its finishers ran), then the queued shadow jobs are done."""
    await until(lambda: sum(entry["event"] == "request" for entry in logs) >= requests)
    await asyncio.sleep(0.01)  # the submissions scheduled by the last finishers
    assert gateway.shadow is not None
    await asyncio.wait_for(gateway.shadow.drain(), 30)


async def test_an_arm_on_a_slower_tier_is_found_worse_on_ttft(start_emulator: StartEmulator, start_app: StartApp,
                                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow = await start_emulator("int4"), await start_emulator("fp16")  # ~7 ms vs ~33 ms to the first token
    experiment = {"name": "slow-tier", "arms": [{"name": "control", "share": 0.5, "control": True},
                                                {"name": "slow", "share": 0.5, "default_tier": "slow"}]}
    config = gateway_config([tier("fast", [f"{fast.url}/v1"]), tier("slow", [f"{slow.url}/v1"])],
                            policy={"experiments": [experiment], "ttft_slo_ms": 2000})
    url = await start_app(create_app(config))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            answers = await gather_bounded([lambda i=i: chat(session, url, f"question {i}", user=f"user-{i}",
                                                             stream=True, max_tokens=3) for i in range(240)], 8)
    assert all(status == 200 for status, _, _ in answers)
    arms = {headers["x-gateway-arm"]: headers["x-gateway-tier"] for _, headers, _ in answers}
    assert arms == {"slow-tier/control": "fast", "slow-tier/slow": "slow"}
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert {line["ttft_slo_ms"] for line in lines} == {2000}
    log = tmp_path / "requests.log"
    log.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))

    assert run_experiments(["report", str(log), "--csv", str(tmp_path / "arms.csv"), "--bootstrap", "400"]) == 0
    assert "slow-tier" in capsys.readouterr().out
    with (tmp_path / "arms.csv").open() as f:
        rows = {(row["metric"], row["arm"]): row for row in csv.DictReader(f)}
    median = rows[("ttft_p50", "slow")]  # ~33 ms against ~7 ms to the first token: worse beyond any doubt
    assert median["verdict"] == "worse" and float(median["diff_ci_low"]) > 0, median
    # 120 requests an arm: its p99 is a few requests, which a busy machine can delay in either arm (a CI run once
    # found the slower tier's tail not certainly worse): higher, but not required to be beyond doubt
    tail = rows[("ttft_p99", "slow")]
    assert float(tail["diff_vs_control"]) > 0 and tail["verdict"] in ("worse", "inconclusive"), tail
    assert rows[("requests", "control")]["control"] == "1"
    assert 0.4 < float(rows[("requests", "slow")]["value"]) < 0.6


async def test_a_50_50_experiment_splits_evenly_and_sticks_to_the_user(start_emulator: StartEmulator,
                                                                       start_app: StartApp) -> None:
    emulator = await start_emulator()
    experiment = {"name": "half", "sticky_by": "user",  # the policy lets `user` decide (issue 37)
                  "arms": [{"name": "a", "share": 0.5, "control": True},
                           {"name": "b", "share": 0.5, "max_tokens": {"default": 5, "maximum": 5}}]}
    config = gateway_config([tier("small", [f"{emulator.url}/v1"])], policy={"experiments": [experiment]})
    url = await start_app(create_app(config))
    users = [f"user-{i}" for i in range(400)]
    async with aiohttp.ClientSession() as session:
        first = await gather_bounded([lambda u=u: chat(session, url, "hello", user=u) for u in users], 16)
        again = await gather_bounded([lambda u=u: chat(session, url, f"another question from {u}", user=u)
                                      for u in users], 16)
        # without `user`, the conversation (system prompt + first user message) is the key: later turns follow it
        turns = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"topic {i}"}]
                 for i in range(40)]
        opened = await gather_bounded([lambda t=t: chat(session, url, "", messages=t) for t in turns], 16)
        followed = await gather_bounded([lambda t=t: chat(session, url, "", messages=[
            *t, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}]) for t in turns], 16)
    arm_of = [headers["x-gateway-arm"] for _, headers, _ in first]
    share_b = arm_of.count("half/b") / len(users)
    assert abs(share_b - 0.5) <= 0.04, share_b  # 400 users: one standard deviation is 2.5 points
    assert arm_of == [headers["x-gateway-arm"] for _, headers, _ in again]
    assert [h["x-gateway-arm"] for _, h, _ in opened] == [h["x-gateway-arm"] for _, h, _ in followed]
    assert len({h["x-gateway-arm"] for _, h, _ in opened}) == 2


async def test_an_arm_never_loosens_the_tenants_cap_and_user_does_not_pick_it(start_emulator: StartEmulator,
                                                                                start_app: StartApp) -> None:
    """Issue 37: an arm's max_tokens (3,000) replaced the tenant's 128 maximum with on_exceed: reject, and a
    client picked that arm through `user`."""
    emulator = await start_emulator()
    experiment = {"name": "loose", "arms": [{"name": "c", "share": 0.5, "control": True},
                                            {"name": "big", "share": 0.5, "max_tokens": {"default": 3000,
                                                                                         "maximum": 3000}}]}
    config = gateway_config([tier("small", [f"{emulator.url}/v1"])], policy={
        "experiments": [experiment], "max_tokens": {"default": 64, "maximum": 128, "on_exceed": "reject"}})
    url = await start_app(create_app(config))
    async with aiohttp.ClientSession() as session:
        asked = await gather_bounded([lambda i=i: chat(session, url, f"topic {i}", max_tokens=3000)
                                      for i in range(40)], 8)
        steered = await gather_bounded([lambda u=u: chat(session, url, "one question", user=f"user-{u}")
                                        for u in range(40)], 8)
    assert {status for status, _, _ in asked} == {400}  # in either arm: the tenant's maximum, rejected
    assert len({headers["x-gateway-arm"] for _, headers, _ in steered}) == 1  # `user` moves nobody


def shadow_tiers(small: str, large: str, busy: str | None = None) -> list[Tier]:
    tiers = [tier("small", [f"{small}/v1"]), tier("large", [f"{large}/v1"], input_per_mtok=5.0, output_per_mtok=15.0)]
    if busy is not None:  # one batch slot: a stream in flight fills its admission gate
        tiers.append(tier("busy", [f"{busy}/v1"]).model_copy(update={"slots_per_replica": 1}))
    return tiers


async def test_shadow_requests_leave_the_answer_alone_and_are_logged_with_their_cost(
        start_emulator: StartEmulator, start_app: StartApp, tmp_path: Path) -> None:
    small, large = await start_emulator(seed=0), await start_emulator(seed=1)  # the seeds make their answers differ
    tiers = shadow_tiers(small.url, large.url)
    plain = await start_app(create_app(gateway_config(tiers)))
    policy = {"shadow": SHADOW, "rate_limit": {"requests_per_min": 6}}  # shadow calls must not count against it
    app = create_app(gateway_config(tiers, policy=policy), shadow_pairs=tmp_path / "pairs.jsonl")
    shadowed = await start_app(app)
    prompts = [(f"prompt {i}", i % 2 == 0) for i in range(6)]
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            without = [await chat(session, plain, p, stream=s, seed=7) for p, s in prompts]
            served = [await chat(session, shadowed, p, stream=s, seed=7) for p, s in prompts]
            await shadows_done(app[GATEWAY], logs, 2 * len(prompts))
    assert [s for s, _, _ in served] == [200] * len(prompts)
    assert [text for _, _, text in served] == [text for _, _, text in without]
    assert {h["x-gateway-tier"] for _, h, _ in served} == {"small"}
    shadows = [entry for entry in logs if entry["event"] == "shadow"]
    ids = [h["x-request-id"] for _, h, _ in served]
    assert sorted(line["request_id"] for line in shadows) == sorted(ids)
    for line in shadows:
        assert (line["from_tier"], line["to_tier"], line["status"]) == ("small", "large", 200)
        assert line["shadow_cost_usd"] > 0 and -1.0 <= line["agreement"] < 0.999
    assert sum(entry["event"] == "request" for entry in logs) == 2 * len(prompts)  # no request line of their own
    pairs = [orjson.loads(line) for line in (tmp_path / "pairs.jsonl").read_bytes().splitlines()]
    assert sorted(pair["request_id"] for pair in pairs) == sorted(ids)
    assert all(pair["answer"] != pair["reference"] and pair["prompt"].startswith("prompt") for pair in pairs)


async def test_shadow_requests_stop_under_admission_pressure(start_emulator: StartEmulator, start_app: StartApp,
                                                              tmp_path: Path) -> None:
    small, large, busy = await start_emulator(seed=0), await start_emulator(seed=1), await start_emulator("fp16")
    app = create_app(gateway_config(shadow_tiers(small.url, large.url, busy.url), policy={"shadow": SHADOW}),
                     shadow_pairs=tmp_path / "pairs.jsonl")
    url = await start_app(app)
    gateway = app[GATEWAY]
    assert gateway.path is not None and gateway.shadow is not None
    gates = gateway.path.admission.gates
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            # a long answer of the one-slot tier holds its gate at its limit: the gateway is under pressure
            held = asyncio.create_task(chat(session, url, "a long one", model="busy", stream=True, max_tokens=400,
                                            min_tokens=400))
            await until(lambda: "busy" in gates and gates["busy"].in_flight >= gates["busy"].slots)
            pressed = [await chat(session, url, f"while busy {i}") for i in range(4)]
            await shadows_done(gateway, logs, len(pressed))
            assert [entry for entry in logs if entry["event"] == "shadow"] == []
            assert gateway.shadow.stats["skipped_pressure"] >= len(pressed)
            held.cancel()  # the client hangs up: the slot frees, the pressure ends
            await asyncio.gather(held, return_exceptions=True)
            await until(lambda: gates["busy"].in_flight == 0)
            calm = [await chat(session, url, f"when calm {i}") for i in range(3)]
            await shadows_done(gateway, logs, len(pressed) + 1 + len(calm))
    assert all(status == 200 for status, _, _ in pressed + calm)
    shadowed = {entry["request_id"] for entry in logs if entry["event"] == "shadow"}
    assert shadowed == {headers["x-request-id"] for _, headers, _ in calm}


METRICS_TOKEN = "metrics-token"  # the shadow series name tenants: served only with a metrics key (issue 37)


async def shadow_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, dict[tuple[str, ...], float]]:
    """The gateway_shadow_* samples of GET /metrics: sample name -> (label values, in label-name order) -> value."""
    async with session.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}) as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[str, dict[tuple[str, ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("gateway_shadow_") and not sample.name.endswith("_created"):
                key = tuple(value for _, value in sorted(sample.labels.items()))
                samples.setdefault(sample.name, {})[key] = sample.value
    return samples


async def test_shadow_outcomes_agreement_and_cost_are_in_metrics_as_the_log_lines_say(
        start_emulator: StartEmulator, start_app: StartApp, tmp_path: Path) -> None:
    small, large, busy = await start_emulator(seed=0), await start_emulator(seed=1), await start_emulator("fp16")
    failing = await start_emulator(faults=FaultConfig(error_rate=1.0))  # a 500 before any byte: nothing to price
    tiers = [*shadow_tiers(small.url, large.url, busy.url), tier("failing", [f"{failing.url}/v1"])]
    tenants = [TENANTS[0], {**TENANTS[1], "shadow": {"share": 1.0, "from": "small", "to": "failing"}}]
    metrics_keys = [hashlib.sha256(METRICS_TOKEN.encode()).hexdigest()]
    app = create_app(gateway_config(tiers, policy={"shadow": SHADOW, "tenants": tenants,
                                                   "metrics_keys_sha256": metrics_keys}),
                     shadow_pairs=tmp_path / "pairs.jsonl")
    url = await start_app(app)
    gateway = app[GATEWAY]
    assert gateway.path is not None and gateway.shadow is not None
    gates = gateway.path.admission.gates
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            calm = [await chat(session, url, f"calm {i}", stream=i % 2 == 0) for i in range(4)]
            refused = [await chat(session, url, f"other {i}", key=OTHER_KEY) for i in range(2)]
            await shadows_done(gateway, logs, len(calm) + len(refused))
            held = asyncio.create_task(chat(session, url, "a long one", model="busy", stream=True, max_tokens=400,
                                            min_tokens=400))
            await until(lambda: "busy" in gates and gates["busy"].in_flight >= gates["busy"].slots)
            pressed = [await chat(session, url, f"while busy {i}") for i in range(3)]
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
            await until(lambda: gates["busy"].in_flight == 0)
            await shadows_done(gateway, logs, len(calm) + len(refused) + len(pressed) + 1)
            metrics = await shadow_metrics(session, url)
    assert all(status == 200 for status, _, _ in calm + refused + pressed)
    shadows = [entry for entry in logs if entry["event"] == "shadow"]
    ours = [line for line in shadows if line["tenant"] == TEST_TENANT]
    theirs = [line for line in shadows if line["tenant"] == OTHER_TENANT]
    assert [line["status"] for line in ours] == [200] * len(calm)
    assert len(theirs) == len(refused) and all(line["status"] >= 500 for line in theirs)
    assert {line["request_id"] for line in ours} == {headers["x-request-id"] for _, headers, _ in calm}

    # outcomes: label order (from_tier, outcome, tenant, to_tier); exactly these series, with these counts
    assert metrics["gateway_shadow_requests_total"] == {
        ("small", "stored", TEST_TENANT, "large"): len(ours),
        ("small", "reference_failed", OTHER_TENANT, "failing"): len(theirs),
        ("small", "skipped_pressure", TEST_TENANT, "large"): len(pressed),
    }
    assert {outcome for _, outcome, _, _ in metrics["gateway_shadow_requests_total"]} <= set(OUTCOMES)
    assert dict(gateway.shadow.stats) == {"sampled": 6, "submitted": 6, "stored": 4, "reference_failed": 2,
                                          "skipped_pressure": 3}

    # agreement of the stored pairs only (the failed references have none): label order (from_tier, tenant, to_tier)
    agreements = [line["agreement"] for line in ours]
    pair = ("small", TEST_TENANT, "large")
    assert metrics["gateway_shadow_agreement_count"] == {pair: len(ours)}
    assert metrics["gateway_shadow_agreement_sum"][pair] == pytest.approx(sum(agreements))
    buckets = {float(le): count for (from_tier, le, *rest), count in metrics["gateway_shadow_agreement_bucket"].items()
               if (from_tier, *rest) == pair}
    assert len(buckets) == len(metrics["gateway_shadow_agreement_bucket"]) == len(AGREEMENT_BUCKETS) + 1
    for bound in AGREEMENT_BUCKETS:
        assert buckets[bound] == sum(agreement <= bound for agreement in agreements), bound
    assert buckets[float("inf")] == len(ours)

    # cost: the reference calls' (label order: tenant, to_tier); the failing tier's errors cost nothing
    assert metrics["gateway_shadow_cost_usd_total"].keys() == {(TEST_TENANT, "large")}
    spent = metrics["gateway_shadow_cost_usd_total"][(TEST_TENANT, "large")]
    assert spent > 0 and spent == pytest.approx(sum(line["shadow_cost_usd"] for line in shadows))


async def feedback(session: aiohttp.ClientSession, url: str, key: str | None, **body: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(f"{url}/v1/feedback", json=body, headers=headers) as response:
        return response.status, orjson.loads(await response.read())


async def test_feedback_is_tenant_checked_stored_and_logged(start_emulator: StartEmulator, start_app: StartApp,
                                                            redis_url: str) -> None:
    emulator = await start_emulator()
    experiment = {"name": "e", "arms": [{"name": "all", "share": 1.0, "control": True}]}
    config = gateway_config([tier("small", [f"{emulator.url}/v1"])],
                            policy={"tenants": TENANTS, "experiments": [experiment]})
    url = await start_app(create_app(config, redis_url=redis_url))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            _, headers, _ = await chat(session, url, "rate me", user="u1")
            request_id = headers["x-request-id"]
            other = await feedback(session, url, OTHER_KEY, request_id=request_id, score=0.0)
            unknown = await feedback(session, url, TEST_API_KEY, request_id="no-such-request", score=1.0)
            keyless = await feedback(session, url, None, request_id=request_id, score=1.0)
            both = await feedback(session, url, TEST_API_KEY, request_id=request_id, score=1.0, thumbs="up")
            ok = await feedback(session, url, TEST_API_KEY, request_id=request_id, thumbs="up", comment="spot on")
    for status, body in (other, unknown):  # another tenant's id and an unknown one: the same 404, OpenAI's shape
        assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == "request_not_found" and body["error"]["param"] == "request_id"
    assert keyless[0] == 401 and keyless[1]["error"]["code"] == "invalid_api_key"
    assert both[0] == 400 and both[1]["error"]["param"] == "score"
    assert ok == (200, {"object": "feedback", "request_id": request_id, "score": 1.0, "created": ok[1]["created"],
                        "experiment": "e", "arm": "all", "replaced": False})
    [line] = [entry for entry in logs if entry["event"] == "feedback"]
    assert (line["tenant"], line["request_id"], line["score"], line["arm"]) == (TEST_TENANT, request_id, 1.0, "all")
    refused = [entry for entry in logs if entry["event"] == "feedback_refused"]
    assert [entry["reason"] for entry in refused] == ["other_tenant", "unknown"]
    client = Redis.from_url(redis_url)
    try:
        [stored] = (await client.hgetall(f"feedback:{{{TEST_TENANT}}}:by_id")).values()
        assert orjson.loads(stored)["comment"] == "spot on"
        assert await client.hlen(f"feedback:{{{OTHER_TENANT}}}:by_id") == 0
    finally:
        await client.aclose()


async def test_feedback_is_limited_per_tenant_and_kept_once_per_request(
    start_emulator: StartEmulator, start_app: StartApp, redis_url: str, tmp_path: Path,
) -> None:
    """Issue 37: 40 posts on one answer. The tenant's limit (its requests_per_min, 30) refuses the last 10 with a
    429; the store keeps one feedback for the request (the last); every later line says it replaces the one
    before, and training reads one label for the prompt, weighted as the other tenant's one label."""
    emulator = await start_emulator()
    tenants = [{**TENANTS[0], "rate_limit": {"requests_per_min": 30}}, TENANTS[1]]
    config = gateway_config([tier("small", [f"{emulator.url}/v1"])], policy={"tenants": tenants})
    url = await start_app(create_app(config, redis_url=redis_url))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            _, headers, _ = await chat(session, url, "rate me")
            _, other_headers, _ = await chat(session, url, "rate me", key=OTHER_KEY)
            request_id = headers["x-request-id"]
            posts = [await feedback(session, url, TEST_API_KEY, request_id=request_id, score=1.0 if i else 0.0)
                     for i in range(40)]
            other = await feedback(session, url, OTHER_KEY, request_id=other_headers["x-request-id"], score=0.0)
            async with session.post(f"{url}/v1/feedback", json={"request_id": request_id, "score": 1.0},
                                    headers=AUTH) as response:
                retry_after = response.headers.get("Retry-After")
    assert [status for status, _ in posts] == [200] * 30 + [429] * 10 and retry_after is not None
    assert posts[-1][1]["error"]["code"] == "feedback_rate_limited"
    assert [body["replaced"] for _, body in posts[:30]] == [False] + [True] * 29
    assert other[0] == 200  # the other tenant's limit is its own
    lines = [entry for entry in logs if entry["event"] == "feedback"]
    assert [line["replaces"] for line in lines if line["tenant"] == TEST_TENANT] == [False] + [True] * 29
    client = Redis.from_url(redis_url)
    try:
        stored = await client.hgetall(f"feedback:{{{TEST_TENANT}}}:by_id")
        assert list(stored) == [request_id.encode()] and orjson.loads(stored[request_id.encode()])["score"] == 1.0
    finally:
        await client.aclose()
    from gateway.training.traffic_outcomes import read_mixed

    log = tmp_path / "requests.log"
    log.write_bytes(b"".join(orjson.dumps({**line, "prompt": "rate me"}) + b"\n" for line in lines))
    rows, counts = read_mixed([log])
    assert (counts.feedback, counts.feedback_replaced) == (2, 29)
    [row] = rows  # alice's last score (1.0) and the other tenant's (0.0) weigh the same
    assert row.scores == {"small": pytest.approx(0.5)}
