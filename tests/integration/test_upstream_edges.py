"""Issue 38, the upstream hop's edges, tried from outside:

- a replica behind TLS (its own CA, a client certificate, `verify: false`) is probed and scraped with its own TLS
  settings, like its requests: healthy after its probes, 200, /readyz ready (the app-wide aiohttp session had none
  of them: every request 503 `no_replica_available`);
- a replica that sent its whole answer, finish_reason included, then dropped before usage and [DONE]: the gateway
  ends the stream (one finish per choice), and asks no other replica for more;
- a resumed stream's usage describes the client's request (its prompt once, every token sent), while the log line
  prices the work done (both parts' prompts)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.backends.h1 import UpstreamClient
from gateway.backends.upstream import post
from gateway.config import Tier
from gateway.emulator.faults import FaultConfig
from gateway.state import GATEWAY
from gateway.testing import TEST_API_KEY, gateway_config, tier
from gateway.testing.upstream import DONE, SEEN, chunk, content, scripted_upstream
from tests.conftest import StartApp, StartEmulator, StartGateway
from tests.unit.h1_certs import Pki, make_pki

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "secure"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\nvllm:num_requests_waiting 2\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _replica_app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_get("/metrics", metrics)
    return app


async def _serve_tls(context: ssl.SSLContext) -> AsyncIterator[int]:
    runner = web.AppRunner(_replica_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


def _tls_tier(port: int, tls: dict[str, Any]) -> Tier:
    return Tier.model_validate({
        "name": "t", "precision": "int4", "context_window": 8192,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": "t-0", "url": f"https://localhost:{port}/v1", "model": "m", "tls": tls}]})


@pytest.mark.parametrize("setting", ["ca_file", "client_cert", "verify_false"])
async def test_a_tls_replica_is_healthy_after_its_probes_and_answers(
        pki: Pki, start_gateway: StartGateway, setting: str) -> None:
    server_context = pki.server_context(require_client_cert=setting == "client_cert")
    tls = {"ca_file": {"ca_file": str(pki.ca)},
           "client_cert": {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)},
           "verify_false": {"verify": False}}[setting]
    replicas = _serve_tls(server_context)
    port = await replicas.__anext__()
    try:
        config = gateway_config([_tls_tier(port, tls)],
                                balancing={"health_interval_s": 0.1, "scrape_interval_s": 0.1})
        gateway = await start_gateway(config)
        async with aiohttp.ClientSession() as session:
            await asyncio.sleep(0.5)  # several probes and scrapes
            async with session.post(f"{gateway}/v1/chat/completions", headers=AUTH,
                                    json={"model": "t", "messages": [{"role": "user", "content": "hi"}]}) as response:
                status, body = response.status, await response.json()
            async with session.get(f"{gateway}/readyz") as response:
                ready = await response.json()
            async with session.get(f"{gateway}/metrics") as response:
                metrics = await response.text()
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "secure"
        assert ready["backends"] == "ready" and ready["backend_tiers"]["t"]["up"] == 1, ready
        assert 'gateway_replica_healthy{backend="t-0"} 1.0' in metrics
        assert 'gateway_replica_backend_running{backend="t-0"} 3.0' in metrics  # the /metrics scrape got through
    finally:
        await replicas.aclose()


def _finished_then_dropped() -> web.Application:
    """The whole answer with its finish_reason, then the connection ends: no usage, no [DONE]."""
    return scripted_upstream([chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "finish_reason": None}]), content("All"), content(" done.", "stop")])


TOOLS = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize("extra", [{}, TOOLS], ids=["resumable", "offering_tools"])
async def test_a_stream_whose_answer_finished_is_not_continued(start_app: StartApp, start_gateway: StartGateway,
                                                               extra: dict[str, Any]) -> None:
    """Whether or not the request could be resumed: its answer was whole, only its end was lost."""
    first, second = _finished_then_dropped(), _finished_then_dropped()
    urls = [f"{await start_app(app)}/v1" for app in (first, second)]
    gateway = await start_gateway(gateway_config([tier("t", urls)]))
    body = {"model": "t", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 40,
            "messages": [{"role": "user", "content": "finish once"}], **extra}
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
                status, raw = response.status, await response.read()
    events = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    finishes = [c["finish_reason"] for e in events for c in e.get("choices") or () if c.get("finish_reason")]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices") or ())
    assert status == 200 and raw.endswith(DONE) and b'"error"' not in raw, raw
    assert finishes == ["stop"] and text == "All done."
    assert len(first[SEEN]) + len(second[SEEN]) == 1  # nobody was asked to go on
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1
    line = next(e for e in logs if e["event"] == "request")
    assert (line["outcome"], line["resumed"], line["finish_reason"]) == ("ok", False, "stop")


async def test_a_resumed_streams_usage_counts_the_prompt_once(start_emulator: StartEmulator,
                                                              start_gateway: StartGateway) -> None:
    a, b = await start_emulator(seed=7), await start_emulator(seed=7)
    counted = tier("t", [f"{a.url}/v1", f"{b.url}/v1"], tokenizer="emulator")  # the tokens sent, as the backend's
    gateway = await start_gateway(gateway_config([counted]))
    body = {"model": "t", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 20,
            "ignore_eos": True, "messages": [{"role": "user", "content": "count my prompt once"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
            whole = await response.read()
        a.engine.faults.config = b.engine.faults.config = FaultConfig(disconnect_after_tokens=5)
        with capture_logs() as logs:
            async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
                raw = await response.read()
    usage_of = lambda data: next(orjson.loads(e[6:])["usage"] for e in data.split(b"\n\n")  # noqa: E731
                                 if e.startswith(b"data: {") and b'"usage":{' in e)
    prompt = usage_of(whole)["prompt_tokens"]
    usage = usage_of(raw)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (prompt, 20, prompt + 20)
    line = next(e for e in logs if e["event"] == "request")
    assert line["resumed"] and [p["prompt_tokens"] for p in line["parts"]] == [prompt, prompt + 5]
    assert line["prompt_tokens"] == 2 * prompt + 5 and line["completion_tokens"] == 20  # the work done, priced


async def test_a_resume_counts_the_tokens_sent_not_the_chunks(start_app: StartApp,
                                                               start_gateway: StartGateway) -> None:
    """A chunk may carry several tokens (vLLM's stream intervals, speculative decoding): the continuation's
    max_tokens and the client's usage count the text sent with the tier's tokenizer."""
    broken = scripted_upstream([chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]), content(" the answer is")])  # 3 tokens, then EOF
    going_on = scripted_upstream([content(" here", "stop"),
                                  chunk([], usage={"prompt_tokens": 13, "completion_tokens": 1, "total_tokens": 14}),
                                  DONE])
    urls = [f"{await start_app(app)}/v1" for app in (broken, going_on)]
    gateway = await start_gateway(gateway_config([tier("t", urls, tokenizer="emulator")]))
    body = {"model": "t", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5,
            "messages": [{"role": "user", "content": "tokens"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
            raw = await response.read()
    assert [sent["max_tokens"] for sent in going_on[SEEN]] == [2]  # 5 asked, 3 sent
    usage = next(orjson.loads(e[6:])["usage"] for e in raw.split(b"\n\n") if b'"usage":{' in e)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (10, 4)


async def test_every_lease_of_a_resumed_stream_ends_once(start_app: StartApp) -> None:
    """The first part's lease, and each continuation's (one refused with a 500, one cut off before its first byte):
    each Attempt releases its own, whatever way it ends; nothing stays in flight."""
    broken = scripted_upstream([content(" half")])  # then EOF: no finish, no [DONE]

    async def refusing(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "down"}}, status=500)

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response  # ends without a byte of body

    apps = []
    for handler in (refusing, silent):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        apps.append(app)
    urls = [f"{await start_app(app)}/v1" for app in (broken, *apps)]
    gateway_app = create_app(gateway_config([tier("t", urls)], policy={"resume": {"max_attempts": 2}},
                                            balancing={"retry_budget": {"ratio": 1.0, "min_per_s": 1000}}))
    gateway = await start_app(gateway_app)
    body = {"model": "t", "stream": True, "max_tokens": 20, "messages": [{"role": "user", "content": "leases"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{gateway}/v1/chat/completions", json=body, headers=AUTH) as response:
            raw = await response.read()
    assert b"not resumed: no other replica could take it" in raw
    states = gateway_app[GATEWAY].pool.states()
    assert {name: state.in_flight for name, state in states.items()} == {"t-0": 0, "t-1": 0, "t-2": 0}
    assert all(state.pending == 0 and state.pending_tokens == 0 for state in states.values())
    assert all(state.breaker.consecutive_failures >= 1 for state in states.values())  # each counted as its replica's failure


async def test_a_reload_keeps_a_tls_replicas_idle_connections(pki: Pki) -> None:
    """Two loads of the same TLS settings are one pool of connections (keyed by the settings' value)."""
    replicas = _serve_tls(pki.server_context())
    port = await replicas.__anext__()
    client = UpstreamClient()
    try:
        for _ in range(2):  # each time a fresh config load: a new SSLContext object, the same settings
            config = gateway_config([_tls_tier(port, {"ca_file": str(pki.ca)})])
            replica = config.routes.tiers[0].replicas[0]
            response = await post(client, replica, "/chat/completions", b"{}", config.routes.upstream)
            await response.read()
        assert client.idle_count() == 1
    finally:
        await client.close()
        await replicas.aclose()

