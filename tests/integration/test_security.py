"""Security over real HTTP: keys never logged nor forwarded, per-backend credentials from config,
no client-controlled upstream, admin behind its own key, and no tenant reads another's cached answers."""

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.classifier.difficulty import DifficultyClassifier, load_classifier
from gateway.config import ConfigError, GatewayConfig, PolicyConfig, RoutesConfig
from gateway.config.loader import load_routes
from gateway.testing import CHAT_STREAM, TEST_API_KEY, gateway_config, routes_yaml, tier
from tests.conftest import StartApp, StartEmulator, StartGateway

ROOT = Path(__file__).resolve().parents[2]
OTHER_KEY, ADMIN_KEY, BACKEND_KEY = "sk-other-tenant-7f3a", "sk-admin-2b9c", "sk-backend-credential-5d1e"
CHAT = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
HOP_BY_HOP = ("Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Upgrade")
RECORDED = web.AppKey("recorded", list)


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def two_tenants(config: GatewayConfig, **policy: object) -> GatewayConfig:
    """`config` with a second tenant (OTHER_KEY), the admin key, and `policy` on top."""
    data = config.policy.model_dump()
    data["tenants"] = [*data["tenants"], {"name": "other", "api_key_sha256": sha(OTHER_KEY)}]
    return GatewayConfig.build(config.routes, PolicyConfig.model_validate(
        {**data, "admin_api_key_sha256": sha(ADMIN_KEY), **policy}))


def with_backend_key(config: GatewayConfig, env: str) -> GatewayConfig:
    routes = config.routes.model_dump()
    for t in routes["tiers"]:
        for replica in t["replicas"]:
            replica["api_key_env"] = env
    return GatewayConfig.build(RoutesConfig.model_validate(routes), config.policy)


def recording_upstream() -> web.Application:
    """Answers with a fixed SSE stream or JSON, records the headers it got, and sends hop-by-hop
    and private headers of its own that must not reach the client."""
    recorded: list[dict[str, str]] = []
    own = {"Set-Cookie": "upstream=1", "Proxy-Authenticate": "Basic", "Keep-Alive": "timeout=5",
           "X-Upstream-Secret": "internal", "Server": "upstream/1.0"}

    async def handler(request: web.Request) -> web.StreamResponse:
        recorded.append(dict(request.headers))
        body = await request.json()
        if not body.get("stream"):
            answer = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                   "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            return web.json_response(answer, headers=own)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **own})
        await response.prepare(request)
        await response.write(CHAT_STREAM)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app[RECORDED] = recorded
    return app


@pytest.mark.parametrize("backend_key", [False, True], ids=["no backend key", "backend key from env"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_client_credentials_and_hop_by_hop_headers_stop_at_the_gateway(
        start_app: StartApp, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch, backend_key: bool,
        stream: bool) -> None:
    monkeypatch.setenv("GW_TEST_BACKEND_KEY", BACKEND_KEY)
    app = recording_upstream()
    upstream = await start_app(app)
    config = gateway_config([tier("t", [f"{upstream}/v1"])])
    gateway = await start_gateway(with_backend_key(config, "GW_TEST_BACKEND_KEY") if backend_key else config)
    sent = {"Authorization": f"Bearer {TEST_API_KEY}", "Cookie": "session=client", "Proxy-Authorization": "Basic x",
            "TE": "trailers", "X-Forwarded-Host": "evil.example", "X-Client-Private": "p", "OpenAI-Organization": "o"}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json={**CHAT, "stream": stream},
                                headers=sent) as response:
            assert response.status == 200
            await response.read()
            got = response.headers
    [seen] = app[RECORDED]
    assert seen.get("Authorization") == (f"Bearer {BACKEND_KEY}" if backend_key else None)
    assert TEST_API_KEY not in str(seen)
    for name in ("Cookie", "Proxy-Authorization", "TE", "X-Forwarded-Host", "X-Client-Private", "OpenAI-Organization"):
        assert name not in seen, name
    assert seen["Host"] == upstream.removeprefix("http://")
    for name in ("Set-Cookie", "Proxy-Authenticate", "Keep-Alive", "X-Upstream-Secret"):
        assert name not in got, name
    assert got.get("Server") != "upstream/1.0"


async def test_api_keys_never_reach_the_log(start_app: StartApp, start_gateway: StartGateway,
                                            monkeypatch: pytest.MonkeyPatch, unused_tcp_port: int) -> None:
    monkeypatch.setenv("GW_TEST_BACKEND_KEY", BACKEND_KEY)
    upstream = await start_app(recording_upstream())
    dead = f"http://127.0.0.1:{unused_tcp_port}/v1"
    config = with_backend_key(gateway_config([tier("t", [f"{upstream}/v1"]), tier("down", [dead])]),
                              "GW_TEST_BACKEND_KEY")
    gateway = await start_gateway(two_tenants(config))
    wrong = "sk-wrong-but-close-" + TEST_API_KEY
    attempts = [(TEST_API_KEY, CHAT), (TEST_API_KEY, {**CHAT, "stream": True}), (OTHER_KEY, CHAT),
                (wrong, CHAT), (ADMIN_KEY, CHAT), (TEST_API_KEY, {**CHAT, "model": "down"}),
                (TEST_API_KEY, {"model": "t", "messages": "not a list"})]
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            for key, body in attempts:
                async with session.post(f"{gateway}/v1/chat/completions", json=body,
                                        headers={"Authorization": f"Bearer {key}"}) as response:
                    assert key not in (await response.text())
            async with session.get(f"{gateway}/admin/config", headers={"Authorization": f"Bearer {wrong}"}) as r:
                assert r.status == 401
    assert len([e for e in logs if e["event"] == "request"]) == len(attempts) + 1  # and the admin 401's
    text = repr(logs)
    for secret in (TEST_API_KEY, OTHER_KEY, ADMIN_KEY, BACKEND_KEY, wrong):
        assert secret not in text
    assert sha(TEST_API_KEY) not in text  # not even the stored hash


def test_a_backend_key_comes_from_the_environment_at_load_time(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "routes.yaml"
    file.write_text(routes_yaml("http://127.0.0.1:9/v1").replace("model: m}", "model: m, api_key_env: GW_UNSET_KEY}"))
    monkeypatch.delenv("GW_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError) as refused:
        load_routes(file)
    issue = refused.value.issues[0]  # (pydantic then also reports the emptied tuples above it)
    assert (issue.file, issue.field) == (str(file), "tiers[0].replicas[0].api_key_env")
    assert "GW_UNSET_KEY is not set" in issue.reason
    monkeypatch.setenv("GW_UNSET_KEY", BACKEND_KEY)
    replica = load_routes(file).tiers[0].replicas[0]
    assert replica.api_key == BACKEND_KEY
    assert BACKEND_KEY not in repr(replica) and BACKEND_KEY not in str(replica.model_dump())


def attacker() -> web.Application:
    hits: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"choices": [{"message": {"content": "pwned"}}]})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    app[RECORDED] = hits
    return app


async def test_no_request_can_steer_the_gateway_to_another_upstream(start_app: StartApp,
                                                                    start_emulator: StartEmulator,
                                                                    start_gateway: StartGateway) -> None:
    evil_app = attacker()
    evil = await start_app(evil_app)
    emulator = await start_emulator()
    gateway = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"])]))
    auth = {"Authorization": f"Bearer {TEST_API_KEY}"}
    bodies = [{**CHAT, "model": f"{evil}/v1"}, {**CHAT, "base_url": f"{evil}/v1", "api_base": evil, "url": evil},
              {**CHAT, "model": "t", "extra_body": {"base_url": evil}}]
    headers = [{}, {"Host": evil.removeprefix("http://")}, {"X-Forwarded-Host": evil.removeprefix("http://"),
                                                            "X-Original-URL": f"{evil}/v1/chat/completions"}]
    statuses = []
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            for extra in headers:
                async with session.post(f"{gateway}/v1/chat/completions", json=body,
                                        headers={**auth, **extra}) as response:
                    statuses.append(response.status)
                    await response.read()
    host, port = gateway.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))  # absolute-form request target
    payload = orjson.dumps(CHAT)
    writer.write(f"POST {evil}/v1/chat/completions HTTP/1.1\r\nHost: {evil.removeprefix('http://')}\r\n"
                 f"Authorization: Bearer {TEST_API_KEY}\r\nContent-Length: {len(payload)}\r\n"
                 "Connection: close\r\n\r\n".encode() + payload)
    absolute = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert evil_app[RECORDED] == []
    assert statuses == [404] * 3 + [200] * 6  # an unknown model is refused; other fields change nothing
    assert b"pwned" not in absolute
    assert emulator.engine.stats.received == 7


@pytest.mark.parametrize(("method", "path", "body"), [("GET", "/admin/config", None),
                                                      ("POST", "/admin/explain", {"tenant": "test-tenant",
                                                                                  "request": CHAT})])
async def test_admin_endpoints_take_only_the_admin_key(start_emulator: StartEmulator, start_gateway: StartGateway,
                                                       method: str, path: str, body: dict | None) -> None:
    emulator = await start_emulator()
    gateway = await start_gateway(two_tenants(gateway_config([tier("t", [f"{emulator.url}/v1"])])))
    async with aiohttp.ClientSession() as session:
        async def call(key: str | None) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with session.request(method, gateway + path, json=body, headers=headers) as response:
                payload = await response.json()
                if response.status != 200:
                    assert set(payload["error"]) == {"message", "type", "param", "code"}
                return response.status

        assert [await call(k) for k in (None, TEST_API_KEY, OTHER_KEY, ADMIN_KEY.upper(), ADMIN_KEY)] == [
            401, 401, 401, 401, 200]
        async with session.post(f"{gateway}/v1/chat/completions", json=CHAT,
                                headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as response:
            assert response.status == 401  # the admin key is no tenant's key


async def test_a_tenant_never_gets_another_tenants_cached_stream(start_emulator: StartEmulator, start_app: StartApp,
                                                                 redis_url: str) -> None:
    emulator = await start_emulator()
    config = two_tenants(gateway_config([tier("t", [f"{emulator.url}/v1"])]))
    base = f"{await start_app(create_app(config, redis_url=redis_url))}/v1"
    messages = [{"role": "user", "content": "Tell me a secret of tenant one"}]

    async def ask(key: str) -> str | None:
        async with AsyncOpenAI(base_url=base, api_key=key) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="t", messages=messages, max_tokens=6, seed=11, stream=True)
            [c async for c in raw.parse()]
        await asyncio.sleep(0.1)  # the store runs after the answer
        return raw.headers.get("x-gateway-cache")

    assert [await ask(TEST_API_KEY), await ask(OTHER_KEY), await ask(TEST_API_KEY), await ask(OTHER_KEY)] == [
        None, None, "hit", "hit"]  # each tenant hits only its own entry
    assert emulator.engine.stats.received == 2


@pytest.fixture
async def classifier() -> AsyncIterator[DifficultyClassifier]:
    model = load_classifier(ROOT / "models" / "difficulty")
    yield model
    await model.aclose()


async def test_a_tenant_never_gets_another_tenants_semantic_hit(start_emulator: StartEmulator, start_app: StartApp,
                                                                classifier: DifficultyClassifier,
                                                                redis_url: str) -> None:
    emulator = await start_emulator()
    config = two_tenants(gateway_config([tier("t", [f"{emulator.url}/v1"])]), cache={"semantic": {"threshold": 0.9}})
    url = await start_app(create_app(config, classifier, redis_url))

    async def ask(key: str, prompt: str) -> str | None:
        body = {"model": "t", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2, "temperature": 0}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {key}"}) as response:
                assert response.status == 200
                await response.read()
                return response.headers.get("x-gateway-cache")

    assert await ask(TEST_API_KEY, "What is the capital city of France?") is None
    await asyncio.sleep(0.3)  # the answer and its vector are stored in the background
    assert await ask(OTHER_KEY, "What's the capital city of France?") is None  # the paraphrase: not across tenants
    assert await ask(TEST_API_KEY, "What's the capital city of France?") == "semantic-hit"  # the cache does work
    assert emulator.engine.stats.received == 2
