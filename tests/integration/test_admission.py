"""Admission control and replica health end to end: a real gateway in front of emulators."""

import asyncio
import dataclasses
import hashlib
import re

import aiohttp
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.emulator.faults import FaultConfig
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator, StartGateway

BATCH_KEY = "sk-batch-tenant"
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, "stream": True}


def auth(key: str = TEST_API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def ask(url: str, body: dict = CHAT, key: str = TEST_API_KEY) -> tuple[int, aiohttp.typedefs.LooseHeaders, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=auth(key)) as response:
            return response.status, response.headers, await response.read()


async def load(url: str, requests: int, concurrency: int) -> list[int]:
    """A closed loop: `concurrency` clients send `requests` in all; their statuses."""
    statuses: list[int] = []
    left = iter(range(requests))

    async def client() -> None:
        for _ in left:
            statuses.append((await ask(url))[0])

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return statuses


async def gauge(url: str, name: str, labels: str) -> float:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    assert match, f"{name}{{{labels}}} not in /metrics"
    return float(match.group(1))


async def test_the_limit_adapts_down_when_the_backend_slows_and_up_when_it_recovers(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    emulator = await start_emulator()
    admission = {"initial_limit": 8, "min_limit": 1, "max_limit": 64, "ttft_target_ms": 100}
    url = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])], admission=admission))
    limit = 'tier="t"'
    assert (await load(url, 120, 8)).count(200) == 120
    fast = await gauge(url, "gateway_admission_limit", limit)
    emulator.engine.faults.config = FaultConfig(stall_s=0.3)
    await load(url, 24, 8)
    slowed = await gauge(url, "gateway_admission_limit", limit)
    emulator.engine.faults.config = FaultConfig()
    await load(url, 150, 8)
    recovered = await gauge(url, "gateway_admission_limit", limit)
    assert fast > 8 and slowed < fast / 2 and recovered > slowed * 1.5, (fast, slowed, recovered)


async def test_a_predicted_slo_miss_is_shed_with_503_retry_after_and_logged(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    emulator = await start_emulator(faults=FaultConfig(stall_s=0.3))
    config = gateway_config([tier("t", [f"{emulator.url}/v1"])], policy={"ttft_slo_ms": 100})
    url = await start_gateway(config)
    first, _, _ = await ask(url)  # admitted: nothing is known yet; it teaches the gateway 0.3 s
    with capture_logs() as logs:
        alone, _, _ = await ask(url)  # predicted 0.3 s, but the replica is idle: sent, to keep learning
    assert first == alone == 200 and logs[-1]["predicted_ttft_ms"] > 200
    holder = asyncio.create_task(ask(url))
    await asyncio.sleep(0.05)
    with capture_logs() as logs:
        status, headers, body = await ask(url)
    assert (await holder)[0] == 200 and status == 503
    assert int(headers["Retry-After"]) >= 1
    error = (await _json(body))["error"]
    assert error["code"] == "predicted_slo_miss" and error["type"] == "overloaded_error"
    assert "100 ms TTFT objective" in error["message"]
    line = next(e for e in logs if e["event"] == "request")
    assert (line["status"], line["error"], line["outcome"]) == (503, "predicted_slo_miss", "rejected")
    assert line["predicted_ttft_ms"] > 200
    assert await gauge(url, "gateway_shed_total", 'reason="predicted_slo_miss",tier="t"') == 1


async def _json(body: bytes) -> dict:
    import orjson

    return orjson.loads(body)


def two_tenants(**limits: object) -> dict:
    batch = {"name": "batch-team", "api_key_sha256": hashlib.sha256(BATCH_KEY.encode()).hexdigest(),
             "priority": "batch"}
    tenant = {"name": "test-tenant", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}
    return {"tenants": [tenant, batch], **limits}


async def test_interactive_requests_leave_the_queue_before_batch_ones(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    emulator = await start_emulator(faults=FaultConfig(stall_s=0.2))
    admission = {"initial_limit": 1, "min_limit": 1, "max_limit": 1, "batch_share": 0.0}
    url = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])], policy=two_tenants(),
                                             admission=admission))
    done: list[str] = []

    async def send(name: str, key: str, delay: float) -> None:
        await asyncio.sleep(delay)
        status, _, _ = await ask(url, key=key)
        assert status == 200
        done.append(name)

    await asyncio.gather(send("holder", TEST_API_KEY, 0), send("batch", BATCH_KEY, 0.05),
                         send("interactive", TEST_API_KEY, 0.1))
    assert done == ["holder", "interactive", "batch"]


async def test_a_request_waits_in_the_queue_at_most_its_deadline(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    emulator = await start_emulator(faults=FaultConfig(stall_s=0.5))
    admission = {"initial_limit": 1, "min_limit": 1, "max_limit": 1, "max_wait_ms": 100}
    url = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])], admission=admission))
    holder = asyncio.create_task(ask(url))
    await asyncio.sleep(0.05)
    with capture_logs() as logs:
        status, headers, body = await ask(url)
    assert status == 503 and "Retry-After" in headers
    assert (await _json(body))["error"]["code"] == "queue_timeout"
    line = next(e for e in logs if e["event"] == "request")
    assert line["error"] == "queue_timeout" and 90 <= line["e2e_ms"] < 400
    assert 90 <= line["queue_ms"] <= line["e2e_ms"]  # the refused request's wait, logged (it said 0.0)
    assert (await holder)[0] == 200


async def test_the_circuit_opens_on_a_failing_replica_and_closes_when_it_recovers(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    flaky = await start_emulator(faults=FaultConfig(error_rate=1.0))
    balancing = {"breaker": {"failures": 2, "cooldown_s": 0.3}}
    url = await start_gateway(gateway_config([tier("t", [f"{flaky.url}/v1"])], balancing=balancing))
    statuses = [(await ask(url))[0] for _ in range(2)]
    received = flaky.engine.stats.received
    status, headers, body = await ask(url)  # open: refused at once, the replica spared
    assert statuses == [502, 502] and status == 503 and "Retry-After" in headers
    assert (await _json(body))["error"]["code"] == "no_replica_available"
    assert flaky.engine.stats.received == received
    assert await gauge(url, "gateway_replica_circuit_state", 'backend="t-0"') == 1
    flaky.engine.faults.config = FaultConfig()
    await asyncio.sleep(0.35)
    assert (await ask(url))[0] == 200  # the half-open trial went through and closed the circuit
    assert await gauge(url, "gateway_replica_circuit_state", 'backend="t-0"') == 0


async def test_health_checks_and_the_backends_metrics_feed_the_ranking(
        start_emulator: StartEmulator, start_gateway: StartGateway, unused_tcp_port: int) -> None:
    live = await start_emulator()
    dead = f"http://127.0.0.1:{unused_tcp_port}/v1"
    balancing = {"health_interval_s": 0.1, "scrape_interval_s": 0.1}
    url = await start_gateway(gateway_config([tier("t", [dead, f"{live.url}/v1"])], balancing=balancing))
    await asyncio.sleep(0.3)
    assert await gauge(url, "gateway_replica_healthy", 'backend="t-0"') == 0
    assert await gauge(url, "gateway_replica_healthy", 'backend="t-1"') == 1
    with capture_logs() as logs:
        status, headers, _ = await ask(url)
    assert status == 200 and headers["x-gateway-backend"] == "t-1"
    assert next(e for e in logs if e["event"] == "request")["attempts"] == 1  # the dead one was not tried
    live.engine.profile = dataclasses.replace(live.engine.profile, tpot_1_s=0.05)  # 100 tokens: 5 s
    held = [asyncio.create_task(ask(url, {**CHAT, "max_tokens": 100, "ignore_eos": True})) for _ in range(3)]
    await asyncio.sleep(0.4)
    assert await gauge(url, "gateway_replica_backend_running", 'backend="t-1"') == 3  # read from its /metrics
    assert await gauge(url, "gateway_replica_backend_waiting", 'backend="t-1"') == 0
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)


async def test_auto_traffic_browns_out_to_the_faster_tier_when_its_own_is_saturated(
        start_emulator: StartEmulator, start_app: StartApp) -> None:
    large = await start_emulator(faults=FaultConfig(stall_s=0.4))
    small = await start_emulator()
    tiers = [tier("small", [f"{small.url}/v1"]),
             tier("large", [f"{large.url}/v1"]).model_copy(update={"brownout_to": "small"})]
    policy = {"routing": {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}, "brownout": True}
    admission = {"initial_limit": 1, "min_limit": 1, "max_limit": 1}
    url = await start_app(create_app(gateway_config(tiers, policy=policy, admission=admission), TableScorer({}, 0.9)))
    body = {**CHAT, "model": "auto"}
    holder = asyncio.create_task(ask(url, body))
    await asyncio.sleep(0.1)
    with capture_logs() as logs:
        status, headers, _ = await ask(url, body)
        explicit = asyncio.create_task(ask(url, {**CHAT, "model": "large"}))
        (explicit_status, explicit_headers, _) = await explicit
    assert status == 200 and headers["x-gateway-tier"] == "small"
    lines = [e for e in logs if e["event"] == "request"]
    assert lines[0]["brownout_from"] == "large" and lines[0]["tier"] == "small"
    assert explicit_status == 200 and explicit_headers["x-gateway-tier"] == "large"  # named tiers never move
    assert (await holder)[1]["x-gateway-tier"] == "large"
