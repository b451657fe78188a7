"""Every answer accounted for (issue 37): over raw sockets to a real gateway, a key header that is not UTF-8 is a
401 in the protocol's shape, count_tokens is rate limited and logged, requests aiohttp's parser refuses get an
OpenAI-shaped 400/431 and a line without a traceback, and every endpoint writes exactly one line."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import orjson
import pytest
from structlog.testing import capture_logs

from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, tier
from tests.conftest import StartEmulator, StartGateway

ADMIN_KEY = "sk-edge-admin"
CHAT = orjson.dumps({"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
MESSAGES = orjson.dumps({"model": "t", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
COUNT = orjson.dumps({"model": "t", "messages": [{"role": "user", "content": "hi"}]})
BAD_KEY = b"sk-\xff\xfe-not-utf8"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture
async def gateway(start_emulator: StartEmulator, start_gateway: StartGateway) -> str:
    emulator = await start_emulator()
    tenant = {"name": TEST_TENANT, "api_key_sha256": sha(TEST_API_KEY), "rate_limit": {"requests_per_min": 3}}
    return await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])], policy={
        "tenants": [tenant], "admin_api_key_sha256": sha(ADMIN_KEY)}))


def request(method: str, path: str, headers: dict[str, bytes] | None = None, body: bytes = b"") -> bytes:
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: gateway", b"Connection: close"]
    head += [name.encode() + b": " + value for name, value in (headers or {}).items()]
    if body or method == "POST":
        head += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


async def exchange(url: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the whole answer (the gateway closes): (status, headers, body)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    try:
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), headers, body


async def lines_of(url: str, data: bytes) -> tuple[int, dict[str, str], bytes, list[dict]]:
    """The exchange, and the request-log lines it wrote (waiting for the handler's `finally`)."""
    with capture_logs() as logs:
        status, headers, body = await exchange(url, data)
        await asyncio.sleep(0.05)
    return status, headers, body, [e for e in logs if e["event"] == "request"]


OPENAI, ANTHROPIC = "openai", "anthropic"
UNDECODABLE = [
    ("chat", "POST", "/v1/chat/completions", "Authorization", CHAT, OPENAI),
    ("messages by x-api-key", "POST", "/v1/messages", "x-api-key", MESSAGES, ANTHROPIC),
    ("messages by bearer", "POST", "/v1/messages", "Authorization", MESSAGES, ANTHROPIC),
    ("count_tokens", "POST", "/v1/messages/count_tokens", "x-api-key", COUNT, ANTHROPIC),
    ("admin config", "GET", "/admin/config", "Authorization", b"", OPENAI),
    ("dashboard data", "GET", "/dashboard/data.json", "Authorization", b"", OPENAI),
    ("feedback", "POST", "/v1/feedback", "Authorization", b'{"request_id": "x", "score": 1}', OPENAI),
]


@pytest.mark.parametrize(("name", "method", "path", "header", "body", "shape"), UNDECODABLE,
                         ids=[case[0] for case in UNDECODABLE])
async def test_a_key_that_is_not_utf8_is_a_401_in_the_protocols_shape_and_one_line(
        gateway: str, name: str, method: str, path: str, header: str, body: bytes, shape: str) -> None:
    value = b"Bearer " + BAD_KEY if header == "Authorization" else BAD_KEY
    status, headers, raw, lines = await lines_of(gateway, request(method, path, {header: value}, body))
    assert status == 401, raw
    answer = orjson.loads(raw)
    if shape == ANTHROPIC:
        assert answer["type"] == "error" and answer["error"]["type"] == "authentication_error"
    else:
        assert answer["error"]["type"] == "authentication_error"
    [line] = lines
    assert (line["status"], line["outcome"], line["path"]) == (401, "rejected", path)
    assert line["request_id"] == headers["x-request-id"]


async def test_count_tokens_is_logged_and_rate_limited(gateway: str) -> None:
    key = {"x-api-key": TEST_API_KEY.encode()}
    answers = [await lines_of(gateway, request("POST", "/v1/messages/count_tokens", key, COUNT)) for _ in range(4)]
    assert [status for status, *_ in answers] == [200, 200, 200, 429]  # the tenant's 3 requests a minute
    for status, headers, raw, lines in answers:
        [line] = lines
        assert (line["status"], line["tenant"], line["path"]) == (status, TEST_TENANT, "/v1/messages/count_tokens")
        assert line["cost_usd"] == 0 and line["request_id"] == headers["x-request-id"]
    assert orjson.loads(answers[0][2])["input_tokens"] > 0
    *_, (_, headers, raw, [line]) = answers
    assert orjson.loads(raw)["error"]["type"] == "rate_limit_error" and int(headers["retry-after"]) >= 1
    assert line["error"] == "rate_limit_requests"
    status, _, _, [line] = await lines_of(gateway, request("POST", "/v1/chat/completions", {
        "Authorization": b"Bearer " + TEST_API_KEY.encode()}, CHAT))
    assert (status, line["status"]) == (429, 429)  # one limit: count_tokens spent the chat requests too


REFUSED = [
    ("Content-Length with Transfer-Encoding",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     400, "bad_http_request"),
    ("a 20 kB header", request("GET", "/v1/models", {"X-Big": b"y" * 20_000}), 431, "request_header_fields_too_large"),
    ("200 headers", request("GET", "/v1/models", {f"X-H{i}": b"1" for i in range(200)}), 431,
     "request_header_fields_too_large"),
    ("not HTTP", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400, "bad_http_request"),
]


@pytest.mark.both_loops  # the gateway serves on uvloop: its transport hands aiohttp's parser the bytes
@pytest.mark.parametrize(("name", "data", "status", "code"), REFUSED, ids=[case[0] for case in REFUSED])
async def test_a_request_the_parser_refuses_gets_openai_json_a_line_and_no_traceback(
        gateway: str, caplog: pytest.LogCaptureFixture, name: str, data: bytes, status: int, code: str) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    answered, headers, raw, lines = await lines_of(gateway, data)
    assert answered == status, raw
    error = orjson.loads(raw)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    [line] = lines
    assert (line["status"], line["outcome"], line["error"]) == (status, "rejected", code)
    assert line["request_id"] == headers["x-request-id"]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], "no traceback"
    ok, *_ = await exchange(gateway, request("GET", "/v1/models"))
    assert ok == 200  # and the gateway keeps serving


ADMIN = {"Authorization": b"Bearer " + ADMIN_KEY.encode()}
TENANT = {"Authorization": b"Bearer " + TEST_API_KEY.encode()}
ENDPOINTS = [
    ("GET", "/v1/models", None, b"", 200),
    ("GET", "/openapi.json", None, b"", 200),
    ("GET", "/admin/config", ADMIN, b"", 200),
    ("GET", "/admin/config", None, b"", 401),
    ("POST", "/admin/explain", ADMIN, b"{", 400),
    ("GET", "/dashboard/data.json", None, b"", 401),
    ("GET", "/dashboard/data.json", ADMIN, b"", 200),
    ("GET", "/dashboard/static/nope.js", None, b"", 404),
    ("POST", "/v1/feedback", TENANT, b'{"request_id": "unknown", "score": 1}', 404),
    ("GET", "/v1/chat/completions", TENANT, b"", 405),
    ("GET", "/no/such/path", None, b"", 404),
    ("POST", "/v1/chat/completions", TENANT, CHAT, 200),
    ("POST", "/v1/chat/completions", None, CHAT, 401),
    ("GET", "/metrics?x=1", None, b"", None),  # a probe that answers: no line
    ("GET", "/healthz", None, b"", None),
    ("GET", "/readyz", None, b"", None),
]


@pytest.mark.parametrize(("method", "path", "headers", "body", "status"), ENDPOINTS,
                         ids=[f"{m} {p} {s}" for m, p, _, _, s in ENDPOINTS])
async def test_every_endpoint_writes_exactly_one_line_with_the_status_the_client_saw(
        gateway: str, method: str, path: str, headers: dict[str, bytes] | None, body: bytes, status: int | None) -> None:
    answered, response_headers, raw, lines = await lines_of(gateway, request(method, path, headers, body))
    if status is None:  # a probe answered 200: the orchestrator's, every few seconds, not logged
        assert answered == 200 and lines == []
        return
    assert answered == status, raw
    [line] = lines
    assert (line["status"], line["path"]) == (status, path.partition("?")[0])
    assert line["outcome"] == ("ok" if status < 400 else "rejected")
    assert line["request_id"] == response_headers["x-request-id"]
