"""Bad input over real HTTP: a 4xx in the OpenAI error shape naming the field, and a log line each."""

import gzip
import zlib

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict
from structlog.testing import capture_logs

from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartEmulator, StartGateway

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}", "Content-Type": "application/json"}
GOOD = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
DEEP = orjson.dumps(GOOD)[:-1] + b', "x": ' + b"[" * 300 + b"]" * 300 + b"}"  # orjson writes at most 254 levels


@pytest.fixture
async def gateway(start_emulator: StartEmulator, start_gateway: StartGateway) -> str:
    emulator = await start_emulator()
    config = gateway_config([tier("t", [f"{emulator.url}/v1"], context_window=512)],
                            policy={"max_body_bytes": 2048, "max_tokens": {"default": 16, "maximum": 10_000}})
    return await start_gateway(config)


async def send(url: str, method: str, path: str, body: bytes | None, headers: dict) -> tuple[int, dict, CIMultiDict[str]]:
    async with aiohttp.ClientSession() as session:
        skip = () if "Content-Type" in headers else ("Content-Type",)  # no header unless the case sends one
        async with session.request(method, url + path, data=body, headers=headers,
                                   skip_auto_headers=skip) as response:
            return response.status, orjson.loads(await response.read()), CIMultiDict(response.headers)


CASES = [
    ("malformed JSON", b'{"model": "auto", "messages": [', AUTH, 400, None, "not valid JSON"),
    ("wrong type", orjson.dumps({**GOOD, "temperature": "warm"}), AUTH, 400, "temperature", "temperature"),
    ("missing messages", orjson.dumps({"model": "auto"}), AUTH, 400, "messages", "messages"),
    ("unknown model", orjson.dumps({**GOOD, "model": "gpt-9"}), AUTH, 404, "model", "gpt-9"),
    ("negative max_tokens", orjson.dumps({**GOOD, "max_tokens": -3}), AUTH, 400, "max_tokens", "at least 1"),
    ("absurd max_tokens", orjson.dumps({**GOOD, "max_tokens": 10**9}), AUTH, 400, "max_tokens", "context window"),
    ("over the tier's window", orjson.dumps({**GOOD, "max_tokens": 5000}), AUTH, 400, "max_tokens", "512"),
    ("body too large", orjson.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * 4096}]}), AUTH,
     413, None, "exceeds the limit"),
    ("missing key", orjson.dumps(GOOD), {"Content-Type": "application/json"}, 401, None, "missing API key"),
    ("wrong key", orjson.dumps(GOOD), {**AUTH, "Authorization": "Bearer nope"}, 401, None, "invalid API key"),
    ("JSON 300 levels deep in an unknown field", DEEP, AUTH, 400, "x", "64 levels"),
    ("text/plain", orjson.dumps(GOOD), {**AUTH, "Content-Type": "text/plain"}, 400, "Content-Type", "application/json"),
    ("form-encoded", orjson.dumps(GOOD), {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}, 400,
     "Content-Type", "application/json"),
    ("gzip that is not gzip", orjson.dumps(GOOD), {**AUTH, "Content-Encoding": "gzip"}, 400, "Content-Encoding",
     "gzip"),
    ("truncated gzip", gzip.compress(orjson.dumps(GOOD))[:-12], {**AUTH, "Content-Encoding": "gzip"}, 400,
     "Content-Encoding", "gzip"),
    ("unsupported encoding", orjson.dumps(GOOD), {**AUTH, "Content-Encoding": "zstd"}, 415, "Content-Encoding",
     "zstd"),
    ("two encodings", orjson.dumps(GOOD), {**AUTH, "Content-Encoding": "gzip, gzip"}, 415, "Content-Encoding",
     "gzip, gzip"),
]


ACCEPTED = [
    ("no Content-Type", orjson.dumps(GOOD), {"Authorization": AUTH["Authorization"]}),
    ("JSON with a charset", orjson.dumps(GOOD), {**AUTH, "Content-Type": "application/json; charset=utf-8"}),
    ("gzip", gzip.compress(orjson.dumps(GOOD)), {**AUTH, "Content-Encoding": "gzip"}),
    ("deflate", zlib.compress(orjson.dumps(GOOD)), {**AUTH, "Content-Encoding": "deflate"}),
    ("identity", orjson.dumps(GOOD), {**AUTH, "Content-Encoding": "identity"}),
]


@pytest.mark.parametrize(("name", "body", "headers"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
async def test_accepted_content_types_and_encodings(gateway: str, name: str, body: bytes, headers: dict) -> None:
    status, payload, _ = await send(gateway, "POST", "/v1/chat/completions", body, headers)
    assert status == 200, payload


@pytest.mark.parametrize(("name", "body", "headers", "status", "param", "words"), CASES, ids=[c[0] for c in CASES])
async def test_bad_requests(gateway: str, name: str, body: bytes, headers: dict, status: int, param: str | None,
                            words: str) -> None:
    with capture_logs() as logs:
        got_status, payload, got_headers = await send(gateway, "POST", "/v1/chat/completions", body, headers)
    assert got_status == status
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert words in error["message"]
    assert "Traceback" not in error["message"]
    [line] = [entry for entry in logs if entry["event"] == "request"]
    assert (line["status"], line["outcome"], line["cost_usd"]) == (status, "rejected", 0.0)
    assert line["request_id"] == got_headers["x-request-id"]


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v1/chat/completions", 405), ("GET", "/v1/nothing", 404), ("DELETE", "/", 404),
])
async def test_unknown_routes_answer_in_openai_shape(gateway: str, method: str, path: str, status: int) -> None:
    got_status, payload, _ = await send(gateway, method, path, None, AUTH)
    assert got_status == status and payload["error"]["message"]


async def test_health_readiness_and_metrics(gateway: str) -> None:
    await send(gateway, "POST", "/v1/chat/completions", orjson.dumps({**GOOD, "max_tokens": 2}), AUTH)
    await send(gateway, "POST", "/v1/chat/completions", orjson.dumps({"model": "x"}), AUTH)
    assert (await send(gateway, "GET", "/healthz", None, {}))[0] == 200
    status, ready, _ = await send(gateway, "GET", "/readyz", None, {})
    assert status == 200 and ready["status"] == "ready" and ready["tiers"] == ["t"]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gateway}/metrics") as response:
            text = await response.text()
    assert 'gateway_requests_total{status="200",tier="t"} 1.0' in text
    assert 'gateway_requests_total{status="400",tier="none"} 1.0' in text
    assert 'gateway_e2e_seconds_count{status="200",tier="t"} 1.0' in text
    assert "gateway_requests_in_flight 0.0" in text
