"""The real path: the gateway in front of real llama.cpp servers (`llama-server`, Gemma 3 270M, Q4_K_M and F16)."""

import asyncio
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.config import GatewayConfig, PolicyConfig, RoutesConfig
from gateway.local.redis_server import free_port
from gateway.local.children import start_children, stop_children, wait_healthy
from gateway.testing import TEST_API_KEY, gateway_config
from tests.conftest import StartGateway

MESSAGES = [{"role": "user", "content": "Name three colours."}]



@pytest.fixture(scope="module")
def local_routes() -> Iterator[RoutesConfig]:
    """Two llama.cpp servers for the whole module: one per tier, one thread and two slots each."""
    tiers = []
    for name, model, precision in (("small-q4", "gemma3-270m-q4_k_m", "int4"), ("large-f16", "gemma3-270m-f16", "fp16")):
        tiers.append({
            "name": name, "precision": precision, "context_window": 2048,
            "prices": {"input_per_mtok": 0.05, "output_per_mtok": 0.5},
            "tokenizer": "gguf:gemma3-270m-q4_k_m",
            "replicas": [{"name": f"{name}-a", "url": f"http://127.0.0.1:{free_port()}/v1", "model": model,
                          "launch": {"kind": "llama_cpp", "model": model, "n_threads": 1, "n_ctx": 1024,
                                     "parallel": 2}}],
        })
    routes = RoutesConfig.model_validate({"tiers": tiers})
    children = start_children(routes)
    try:
        asyncio.run(wait_healthy(children, timeout_s=120))
        yield routes
    finally:
        stop_children(children)


@pytest.fixture
async def client(local_routes: RoutesConfig, start_gateway: StartGateway) -> AsyncOpenAI:
    base = gateway_config(list(local_routes.tiers))
    config = GatewayConfig.build(local_routes, PolicyConfig.model_validate(base.policy.model_dump()))
    return AsyncOpenAI(base_url=f"{await start_gateway(config)}/v1", api_key=TEST_API_KEY)


def request_line(logs: list[dict]) -> dict:
    [line] = [entry for entry in logs if entry["event"] == "request"]
    return line


@pytest.mark.parametrize("model", ["auto", "small-q4", "large-f16"])
async def test_non_streaming_chat_real_text_and_usage(client: AsyncOpenAI, model: str) -> None:
    with capture_logs() as logs:
        raw = await client.chat.completions.with_raw_response.create(model=model, messages=MESSAGES, max_tokens=6)
    answer = raw.parse()
    assert answer.choices[0].message.content and answer.choices[0].message.content.strip()
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    assert raw.headers["x-gateway-tier"] == ("small-q4" if model == "auto" else model)
    line = request_line(logs)
    assert (line["usage_source"], line["prompt_tokens"], line["completion_tokens"]) == (
        "backend", answer.usage.prompt_tokens, 6)
    assert line["cost_usd"] == pytest.approx((answer.usage.prompt_tokens * 0.05 + 6 * 0.5) / 1e6)


@pytest.mark.parametrize("stream", [False, True])
async def test_max_completion_tokens_limits_a_llama_cpp_answer(client: AsyncOpenAI, stream: bool) -> None:
    """langchain-openai and newer SDK code send `max_completion_tokens` (llama-cpp-python's server ignored it:
    the gateway forwards the limit as `max_tokens` too); the answer stops there, finish reason `length`."""
    with capture_logs() as logs:
        if stream:
            chunks = [c async for c in await client.chat.completions.create(
                model="small-q4", messages=MESSAGES, max_completion_tokens=5, stream=True)]
            finish = next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)
        else:
            answer = await client.chat.completions.create(model="small-q4", messages=MESSAGES, max_completion_tokens=5)
            finish = answer.choices[0].finish_reason
    assert (request_line(logs)["completion_tokens"], finish) == (5, "length")


@pytest.mark.parametrize("model", ["auto", "large-f16"])
async def test_streaming_chat_usage_comes_from_the_server(client: AsyncOpenAI, model: str) -> None:
    with capture_logs() as logs:
        stream = await client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=6, stream=True)
        chunks = [chunk async for chunk in stream]
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces).strip()
    line = request_line(logs)
    assert line["usage_source"] == "backend"  # llama-server's usage chunk (llama-cpp-python's sent none)
    assert line["completion_tokens"] == len(pieces) == 6
    assert line["prompt_tokens"] > 0 and line["cost_usd"] > 0
    assert 0 < line["ttft_ms"] <= line["e2e_ms"] and line["tpot_ms"] > 0


async def test_streaming_completions_on_the_small_tier(client: AsyncOpenAI) -> None:
    stream = await client.completions.create(model="small-q4", prompt="The capital of France is", max_tokens=4,
                                             stream=True)
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text.strip()


async def test_counted_prompt_tokens_equal_what_llama_cpp_reports(client: AsyncOpenAI) -> None:
    """The tier's counter (used when a stream ends without usage) renders llama-server's `gemma` template and
    tokenizes with the model's vocabulary: its count equals the server's own, system message included."""
    from gateway.tokens import TokenCounters

    counter = TokenCounters().for_spec("gguf:gemma3-270m-q4_k_m")
    conversations = [
        [{"role": "user", "content": "Summarise: the gateway routes prompts to tiers by difficulty."},
         {"role": "assistant", "content": "It routes by difficulty."},
         {"role": "user", "content": "And what does it log?"}],
        [{"role": "system", "content": "  Answer in French. "},
         {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}],
    ]
    for messages in conversations:
        reported = await client.chat.completions.create(model="small-q4", messages=messages, max_tokens=2)
        assert reported.usage is not None
        assert counter.count_prompt("chat", {"messages": messages}) == reported.usage.prompt_tokens


async def test_sdk_streams_with_usage_end_complete_and_match_the_log(client: AsyncOpenAI) -> None:
    """Issue 18: every stream ends with a finish reason and a usage chunk equal to the log line's counts, and is
    logged 200 ok although the SDK closes its connection right after [DONE]."""
    from tests.integration.test_stream_endings import request_lines

    usages, ids = [], []
    with capture_logs() as logs:
        for i in range(6):
            stream = await client.chat.completions.create(
                model="small-q4", messages=[{"role": "user", "content": f"Name {i + 2} colours."}], max_tokens=20,
                stream=True, stream_options={"include_usage": True})
            chunks = [chunk async for chunk in stream]
            ids.append(stream.response.headers["x-request-id"])
            assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
                ["stop"], ["length"])
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            usages.append(chunks[-1].usage)
        lines = {line["request_id"]: line for line in await request_lines(logs, 6)}
    for request_id, usage in zip(ids, usages):
        line = lines[request_id]
        assert (line["status"], line["outcome"], line["usage_source"]) == (200, "ok", "backend")
        assert (line["prompt_tokens"], line["completion_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
        assert 0 < usage.completion_tokens <= 20 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_concurrent_streams_on_one_server_are_not_cut_short(client: AsyncOpenAI) -> None:
    """llama-cpp-python's server interrupted a running stream when another request arrived: [DONE] at once,
    no finish reason, the answer cut. llama-server runs them in its slots (the third waits for one): each
    ends as the model ended it."""
    from tests.integration.test_stream_endings import request_lines

    async def stream_one(i: int) -> None:
        stream = await client.chat.completions.create(
            model="large-f16", messages=[{"role": "user", "content": f"Count to {i + 20}."}], max_tokens=12,
            stream=True, extra_body={"ignore_eos": True})
        [chunk async for chunk in stream]

    with capture_logs() as logs:
        await asyncio.gather(*(stream_one(i) for i in range(3)))
        lines = await request_lines(logs, 3)
    assert [line["error"] for line in lines] == [None] * 3  # not upstream_missing_finish
    assert all(line["finish_reason"] in ("stop", "length") and line["completion_tokens"] > 0 for line in lines)
    assert not [entry for entry in logs if entry["event"] == "upstream_missing_finish"]


async def test_health_probes_neither_cut_a_stream_nor_fail_a_busy_server(local_routes: RoutesConfig,
                                                                         start_gateway: StartGateway) -> None:
    """llama-cpp-python answered GET /v1/models behind its generation lock: a probe cut the running stream
    short (no finish reason), or waited for the answer to end and timed out. Neither on llama-server."""
    from tests.integration.test_stream_endings import request_lines

    balancing = local_routes.balancing.model_copy(update={"health_interval_s": 0.25})
    routes = local_routes.model_copy(update={"balancing": balancing})
    config = GatewayConfig.build(routes, gateway_config(list(routes.tiers)).policy)
    client = AsyncOpenAI(base_url=f"{await start_gateway(config)}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        for max_tokens in (120, 4):  # ~3 s on one thread, then one more once it is done
            stream = await client.chat.completions.create(
                model="large-f16", messages=[{"role": "user", "content": "Write a story about a lighthouse."}],
                max_tokens=max_tokens, stream=True)
            [chunk async for chunk in stream]
        lines = await request_lines(logs, 2)
    assert [(line["status"], line["error"]) for line in lines] == [(200, None)] * 2
    assert lines[0]["completion_tokens"] > 60
    assert not [e for e in logs if e["event"] == "replica_health_changed"]


async def test_two_streams_run_together_in_one_servers_slots(client: AsyncOpenAI) -> None:
    """Issue 31: llama-server decodes its slots together (continuous batching); llama-cpp-python's server
    answered one request at a time, so the second stream's first token came after the first stream's end."""
    import time

    async def timed(i: int) -> tuple[float, float]:
        stream = await client.chat.completions.create(
            model="large-f16", messages=[{"role": "user", "content": f"Tell story number {i}."}], max_tokens=24,
            stream=True, extra_body={"ignore_eos": True})
        first = None
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter()
        assert first is not None
        return first, time.perf_counter()

    (first_a, end_a), (first_b, end_b) = await asyncio.gather(timed(1), timed(2))
    assert max(first_a, first_b) < min(end_a, end_b)


async def test_the_gateway_reads_busy_and_waiting_slots_from_llama_server(
        local_routes: RoutesConfig, start_gateway: StartGateway) -> None:
    """Issue 31: three streams on a two-slot server: its /metrics says 2 processing and 1 deferred, and the
    gateway's scrape shows them as the replica's running and waiting requests (the ranking's queue term)."""
    from tests.integration.test_admission import gauge

    balancing = local_routes.balancing.model_copy(update={"scrape_interval_s": 0.1})
    routes = local_routes.model_copy(update={"balancing": balancing})
    url = await start_gateway(GatewayConfig.build(routes, gateway_config(list(routes.tiers)).policy))
    direct = AsyncOpenAI(base_url=next(t for t in routes.tiers if t.name == "large-f16").replicas[0].url,
                         api_key="none")

    async def hold(i: int) -> None:  # straight to the server: the gateway only watches it
        stream = await direct.chat.completions.create(
            model="gemma3-270m-f16", messages=[{"role": "user", "content": f"Story {i}."}], max_tokens=200,
            stream=True, extra_body={"ignore_eos": True})
        [chunk async for chunk in stream]

    held = [asyncio.create_task(hold(i)) for i in range(3)]
    seen: set[tuple[float, float]] = set()
    try:
        for _ in range(100):
            await asyncio.sleep(0.1)
            seen.add((await gauge(url, "gateway_replica_backend_running", 'backend="large-f16-a"'),
                      await gauge(url, "gateway_replica_backend_waiting", 'backend="large-f16-a"')))
            if (2.0, 1.0) in seen:
                break
    finally:
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
    assert (2.0, 1.0) in seen, seen
