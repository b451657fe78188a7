"""Schemathesis against a live gateway on loopback (emulator backend, real Redis), driven by the
gateway's own /openapi.json: no 5xx, every error in the OpenAI shape, statuses and bodies as
documented, endpoints with a security scheme refuse requests without a key. Then hypothesis on what the
schema cannot express: bodies nested hundreds of levels deep, any Content-Type, any Content-Encoding
(with the body compressed as declared, not at all, or cut short): never a 5xx. Bounded examples."""

import asyncio
import gzip
import hashlib
import zlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (  # type: ignore[attr-defined]  (registered checks, looked up by name)
    content_type_conformance, ignored_auth, not_a_server_error, response_schema_conformance, status_code_conformance,
)

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.emulator.harness import serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.local.redis_server import EmbeddedRedis
from gateway.server import running
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.integration.test_embeddings import EMBEDDER

ADMIN_KEY = "sk-fuzz-admin"
ERROR_FIELDS = {"message", "type", "param", "code"}


async def serve(redis_url: str, started: "Future[str]", stop: asyncio.Event) -> None:
    async with serve_emulator(get_profile("instant")) as emulator:
        base = gateway_config([tier("t", [f"{emulator.url}/v1"]), tier("u", [f"{emulator.url}/v1"]), EMBEDDER])
        policy = PolicyConfig.model_validate({**base.policy.model_dump(), "max_body_bytes": 65536,
                                              "admin_api_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()})
        async with running(create_app(GatewayConfig.build(base.routes, policy), redis_url=redis_url)) as url:
            started.set_result(url)
            await stop.wait()


@pytest.fixture(scope="module")
def live_gateway(redis_server: EmbeddedRedis) -> Iterator[str]:
    """A gateway and its emulator on their own event loop in a thread: schemathesis calls are blocking."""
    loop = asyncio.new_event_loop()
    started: Future[str] = Future()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(redis_server.url, started, stop),))
    thread.start()
    try:
        yield started.result(timeout=30)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="module")
def api_schema(live_gateway: str) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{live_gateway}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def openai_error_shape(ctx: object, response: schemathesis.Response, case: schemathesis.Case) -> bool | None:
    """Every 4xx/5xx is JSON of the OpenAI error shape (Anthropic's on /v1/messages and its count_tokens), with no
    traceback in it."""
    if response.status_code < 400 or case.path == "/metrics":
        return None
    if case.path.startswith("/v1/messages"):  # Anthropic's shape: {"type": "error", "error": {"type", "message"}}
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert "Traceback" not in body["error"]["message"]
        return True
    error = response.json()["error"]
    assert set(error) == ERROR_FIELDS, error
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    return True


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          ignored_auth, openai_error_shape]


@schema.parametrize()
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_the_gateway_answers_any_request_as_documented(case: schemathesis.Case, live_gateway: str) -> None:
    key = ADMIN_KEY if case.path.startswith("/admin") else TEST_API_KEY
    case.call_and_validate(base_url=live_gateway, headers={"Authorization": f"Bearer {key}"}, checks=CHECKS,
                           timeout=10)


def test_the_served_document_names_the_models_and_limits(live_gateway: str) -> None:
    spec = requests.get(f"{live_gateway}/openapi.json", timeout=5).json()
    body = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["model"]["enum"] == ["auto", "t", "u"]
    assert body["properties"]["messages"]["maxItems"] == 2048
    assert body["properties"]["temperature"]["maximum"] == 2.0


def nested_json(kinds: list[bool], leaf: str) -> str:
    """Arrays (False) and objects (True) one inside the other, as JSON text: orjson writes no more than
    254 levels, a client may send any number."""
    opened = "".join('{"k": ' if is_object else "[" for is_object in kinds)
    return opened + leaf + "".join("}" if is_object else "]" for is_object in reversed(kinds))


GOOD_BODY = '{"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'
CONTENT_TYPES = st.one_of(
    st.sampled_from([None, "application/json", "application/json; charset=utf-8", "text/plain", "",
                     "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/*",
                     "application/vnd.api+json", "text/json", "APPLICATION/JSON"]),
    st.text(st.characters(codec="latin-1", exclude_categories=("Cc",)), max_size=40).map(str.strip),
)
ENCODINGS = st.sampled_from([None, "identity", "gzip", "deflate", "br", "zstd", "compress", "gzip, gzip",
                             "GZIP", "x-gzip", "*", "gzip;q=1"])


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A chat body (deeply nested fields or not) with any Content-Type and Content-Encoding, the body
    compressed as declared, or not, or cut short."""
    depth = draw(st.integers(0, 400))
    field = draw(st.sampled_from(["x", "tools", "response_format", "messages", "metadata"]))
    kinds = draw(st.lists(st.booleans(), min_size=depth, max_size=depth))
    body = (GOOD_BODY + f', "{field}": {nested_json(kinds, draw(st.sampled_from(["0", chr(34) * 2, "null"])))}}}'
            ).encode()
    encoding = draw(ENCODINGS)
    encode = draw(st.sampled_from(["as declared", "plain", "cut"]))
    if encode != "plain" and encoding and encoding.lower() in ("gzip", "deflate"):
        body = gzip.compress(body) if encoding.lower() == "gzip" else zlib.compress(body)
        body = body[: len(body) // 2] if encode == "cut" else body
    headers = {"Authorization": f"Bearer {TEST_API_KEY}"}
    content_type = draw(CONTENT_TYPES)
    if content_type is not None:
        headers["Content-Type"] = content_type
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return body, headers


@given(hostile_requests())
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_hostile_bodies_and_headers_never_get_a_5xx(live_gateway: str, hostile: tuple[bytes, dict[str, str]]) -> None:
    body, headers = hostile  # requests sends no Content-Type of its own for bytes
    response = requests.post(f"{live_gateway}/v1/chat/completions", data=body, headers=headers, timeout=10)
    assert response.status_code < 500, (response.status_code, response.text[:300], headers)
    if response.status_code >= 400:
        error = response.json()["error"]
        assert set(error) == ERROR_FIELDS and error["message"], error
    else:
        assert response.json()["choices"]
