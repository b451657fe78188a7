"""Injected faults through the real gateway: what the client receives, no crash, one log line per
request. Backend faults come from the emulator's fault injection; Redis is a real server, frozen
with SIGSTOP; the policy file is overwritten with garbage under traffic. docs/FAULTS.md is the table.

Cases already proven elsewhere are not repeated:
  backend resets mid-stream (stream)      test_forwarding.py::test_mid_stream_backend_disconnect_is_an_error_event
  backend 429 + Retry-After (JSON)        test_forwarding.py::test_backend_rate_limits_pass_on_retry_after
  Redis killed, then restarted            test_redis_degradation.py::
                                          test_requests_flow_while_redis_is_killed_and_restarted
  a policy file with a bad field          test_hot_reload.py::test_reload_valid_then_broken_then_fixed_under_traffic
"""

import asyncio
import hashlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from gateway.emulator.faults import FaultConfig
from gateway.local.redis_server import EmbeddedRedis
from gateway.testing import TEST_API_KEY, gateway_config, routes_yaml, tier
from tests.conftest import StartApp, StartEmulator, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "ignore_eos": True}


@dataclass(frozen=True)
class Fault:
    name: str
    faults: FaultConfig | None  # None: nothing listens on the replica's port
    stream: bool
    status: int
    outcome: str
    error: str  # the log line's `error`
    retry_after: str | None = None
    upstream: dict | None = None  # routes `upstream` settings
    message: str = ""  # a part of the error message the client must see


BACKEND_FAULTS = [
    Fault("refuses connections", None, False, 502, "upstream_error", "upstream_error", message="is unreachable"),
    Fault("refuses connections", None, True, 502, "upstream_error", "upstream_error", message="is unreachable"),
    Fault("answers 500", FaultConfig(error_rate=1.0), False, 502, "upstream_error", "upstream_error"),
    Fault("answers 500", FaultConfig(error_rate=1.0), True, 502, "upstream_error", "upstream_error"),
    Fault("answers 429 + Retry-After", FaultConfig(rate_limit_rate=1.0, retry_after_s=7), True, 503,
          "upstream_error", "upstream_error", retry_after="7"),
    Fault("stalls before the first token", FaultConfig(stall_s=5.0), False, 504, "upstream_error", "upstream_error",
          upstream={"read_timeout_s": 0.3}, message="sent no first byte in time"),
    Fault("stalls before the first token", FaultConfig(stall_s=5.0), True, 504, "upstream_error", "upstream_error",
          upstream={"read_timeout_s": 0.3}, message="sent no first byte in time"),
    Fault("resets mid-answer", FaultConfig(disconnect_after_tokens=3), False, 502, "upstream_error", "upstream_error"),
    Fault("sends a malformed answer", FaultConfig(malformed_sse=True), False, 502, "upstream_error", "upstream_error"),
    Fault("sends malformed SSE", FaultConfig(malformed_sse=True), True, 200, "ok", "upstream_malformed_events"),
]


async def post(session: aiohttp.ClientSession, url: str,
               body: dict) -> tuple[int, bytes, aiohttp.typedefs.LooseHeaders]:
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
        return response.status, await response.read(), response.headers


def request_lines(logs: list[dict]) -> list[dict]:
    return [entry for entry in logs if entry["event"] == "request"]


async def still_serving(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/healthz") as response:
            assert response.status == 200
        async with session.get(f"{url}/metrics") as response:
            assert "gateway_requests_in_flight 0.0" in await response.text()


@pytest.mark.parametrize("fault", BACKEND_FAULTS,
                         ids=[f"{f.name} ({'stream' if f.stream else 'json'})" for f in BACKEND_FAULTS])
async def test_a_backend_fault_reaches_the_client_as_documented(start_emulator: StartEmulator,
                                                                start_gateway: StartGateway, unused_tcp_port: int,
                                                                fault: Fault) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}/v1"
    if fault.faults is not None:
        url = f"{(await start_emulator(faults=fault.faults)).url}/v1"
    gateway = await start_gateway(gateway_config([tier("t", [url])], upstream=fault.upstream))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            status, body, headers = await post(session, gateway, {**CHAT, "stream": fault.stream})
    assert status == fault.status
    assert headers.get("Retry-After") == fault.retry_after
    if status != 200:
        error = orjson.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "upstream_error"
        assert fault.message in error["message"]
    else:  # the garbage event is dropped, the rest arrives whole
        assert b"malformed" not in body and body.endswith(b"data: [DONE]\n\n")
    [line] = request_lines(logs)
    assert (line["status"], line["outcome"], line["error"]) == (fault.status, fault.outcome, fault.error)
    assert line["backend"] == "t-0" and line["request_id"] == headers["x-request-id"]
    if status != 200:
        assert any(entry["event"] == "upstream_attempt_failed" for entry in logs)
    await still_serving(gateway)


async def test_requests_flow_while_redis_is_frozen(start_emulator: StartEmulator, start_app: StartApp) -> None:
    emulator = await start_emulator()
    with EmbeddedRedis() as redis_server:
        config = gateway_config([tier("t", [f"{emulator.url}/v1"])], redis_op_timeout_ms=50)
        url = await start_app(create_app(config, redis_url=redis_server.url))
        body = {**CHAT, "temperature": 0, "max_tokens": 2}
        assert redis_server.process is not None
        with capture_logs() as logs:
            async with aiohttp.ClientSession() as session:
                warm = [await post(session, url, body) for _ in range(2)]
                os.kill(redis_server.process.pid, signal.SIGSTOP)  # answers nothing: a slowed-to-death Redis
                try:
                    frozen = [await asyncio.wait_for(post(session, url, {**body, "stream": i % 2 == 0}), 5)
                              for i in range(6)]
                    async with session.get(f"{url}/readyz") as response:
                        ready = await response.json()
                finally:
                    os.kill(redis_server.process.pid, signal.SIGCONT)
                await asyncio.sleep(1.2)  # the guard's backoff: then one probe finds it again
                back = [await post(session, url, body) for _ in range(3)]
    assert all(status == 200 for status, _, _ in warm + frozen + back)
    assert warm[1][2].get("x-gateway-cache") == "hit"
    assert not any(headers.get("x-gateway-cache") for _, _, headers in frozen)
    assert ready["status"] == "ready" and ready["redis"] == "down"
    assert any(headers.get("x-gateway-cache") == "hit" for _, _, headers in back)
    lines = request_lines(logs)
    assert len(lines) == 11 and all(line["status"] == 200 for line in lines)
    assert any(entry["event"] == "redis_unavailable" for entry in logs)


GARBAGE = {
    "binary": b"\x00\xff\xfe garbage \x89PNG\r\n",
    "truncated YAML": b"default_tier: t\ntenants:\n  - name: team\n    api_key_sha256: [",
    "empty": b"",
    "a YAML list": b"- just\n- a list\n",
}


async def test_a_policy_file_replaced_by_garbage_keeps_the_last_good_one(tmp_path: Path,
                                                                       start_emulator: StartEmulator,
                                                                       start_app: StartApp) -> None:
    emulator = await start_emulator()
    admin = "sk-faults-admin"
    good = (f"default_tier: t\nadmin_api_key_sha256: {hashlib.sha256(admin.encode()).hexdigest()}\n"
            f"tenants:\n  - name: team\n    api_key_sha256: {hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}\n")
    routes, policy = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(routes_yaml(f"{emulator.url}/v1"))
    policy.write_text(good)
    url = await start_app(create_app(load_config(routes, policy), config_files=(routes, policy)))
    errors: dict[str, list[str]] = {}
    statuses: list[int] = []
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            for name, garbage in GARBAGE.items():
                policy.write_bytes(garbage)
                for _ in range(6):
                    statuses.append((await post(session, url, {**CHAT, "max_tokens": 2}))[0])
                    await asyncio.sleep(0.1)
                async with session.get(f"{url}/admin/config", headers={"Authorization": f"Bearer {admin}"}) as r:
                    errors[name] = (await r.json())["last_error"]
    assert set(statuses) == {200}, "the last good policy must keep serving"
    assert len(request_lines(logs)) == len(statuses) + len(GARBAGE)  # and each GET /admin/config
    for name, error in errors.items():
        assert error and str(policy) in error[0], name
    rejected = [entry for entry in logs if entry["event"] == "config_rejected"]
    assert len(rejected) >= len(GARBAGE) and all(str(policy) in entry["issues"][0] for entry in rejected)
