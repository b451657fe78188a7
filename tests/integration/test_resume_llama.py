"""Issue 32 on real llama.cpp: a `llama-server` replica SIGKILLed mid-stream while the `openai` SDK reads; the
other replica (same Gemma 3 270M Q4_K_M weights) continues the answer and the stream ends with one finish
reason, no error, and the text the client had is the start of the answer it gets."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.config import GatewayConfig, PolicyConfig, RoutesConfig
from gateway.local.children import Child, start_child, start_children, stop_children, wait_healthy
from gateway.local.redis_server import free_port
from gateway.testing import TEST_API_KEY, gateway_config
from tests.conftest import StartGateway

TRIALS = int(os.environ.get("RESUME_LLAMA_TRIALS", "4"))  # docs/BENCHMARKS.md "Resumed streams" runs 20
MODEL = "gemma3-270m-q4_k_m"


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[RoutesConfig, list[Child]]]:
    """One tier of two llama.cpp servers (one slot, one thread each)."""
    tier = {"name": "t", "precision": "int4", "context_window": 1024,
            "prices": {"input_per_mtok": 0.05, "output_per_mtok": 0.5}, "tokenizer": f"gguf:{MODEL}",
            "replicas": [{"name": f"t-{i}", "url": f"http://127.0.0.1:{free_port()}/v1", "model": MODEL,
                          "launch": {"kind": "llama_cpp", "model": MODEL, "n_threads": 1, "n_ctx": 1024,
                                     "parallel": 1}} for i in range(2)]}
    routes = RoutesConfig.model_validate({"tiers": [tier], "upstream": {"max_attempts": 2}})
    children = start_children(routes)
    try:
        asyncio.run(wait_healthy(children, timeout_s=120))
        yield routes, children
    finally:
        stop_children(children)


async def test_a_replica_killed_mid_stream_the_sdk_reads_one_whole_answer(
        replicas: tuple[RoutesConfig, list[Child]], start_gateway: StartGateway) -> None:
    routes, children = replicas
    base = gateway_config(list(routes.tiers), balancing={"retry_budget": {"ratio": 1.0, "min_per_s": 100},
                                                          "breaker": {"failures": 1000}})
    config = GatewayConfig.build(routes.model_copy(update={"balancing": base.routes.balancing}),
                                 PolicyConfig.model_validate(base.policy.model_dump()))
    client = AsyncOpenAI(base_url=f"{await start_gateway(config)}/v1", api_key=TEST_API_KEY, max_retries=0)
    same = 0
    for trial in range(TRIALS):
        messages = [{"role": "user", "content": f"Tell me about the number {trial} in three sentences."}]
        uncut = await client.chat.completions.create(model="t", messages=messages, max_tokens=40, temperature=0)
        with capture_logs() as logs:
            async with client.chat.completions.with_streaming_response.create(
                    model="t", messages=messages, max_tokens=40, temperature=0, stream=True,
                    stream_options={"include_usage": True}) as response:
                victim = next(c for c in children if c.name == response.headers["x-gateway-backend"])
                pieces: list[str] = []
                finishes: list[str] = []
                usage = None
                async for chunk in await response.parse():
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices:
                        if choice.delta.content:
                            pieces.append(choice.delta.content)
                            if len(pieces) == 3 and victim.process.poll() is None:
                                os.killpg(victim.process.pid, signal.SIGKILL)
                        if choice.finish_reason:
                            finishes.append(choice.finish_reason)
        text = "".join(pieces)
        uncut_text = uncut.choices[0].message.content or ""
        assert len(finishes) == 1 and finishes[0] in ("stop", "length"), (trial, finishes, text)
        assert usage is not None and usage.completion_tokens >= len(pieces) - 1, (trial, usage)
        line = next(e for e in logs if e["event"] == "request")
        assert line["outcome"] == "ok" and line["resumed"] and line["parts"][0]["completion_tokens"] >= 3, line
        # the continuation follows the text the client had (the first part's tokens, one a chunk): it does not
        # start the answer over ("Tell me aboutTell me about...": a continuation prompt without the text sent)
        sent = "".join(pieces[:line["parts"][0]["completion_tokens"]])
        start, rest = "".join(pieces[:3]).strip(), text[len(sent):]
        assert start and not rest.lstrip().startswith(start), (trial, sent, rest)
        same += text == uncut_text
        if os.environ.get("RESUME_LLAMA_SHOW"):
            print(f"\n--- uncut: {uncut.choices[0].message.content!r}\n--- resumed after {len(pieces[:3])}: {text!r}")
        victim.process.wait()
        restarted = start_child(victim.name, victim.command, victim.health_url, victim.log_path)
        children[children.index(victim)] = restarted
        await wait_healthy([restarted], timeout_s=120)
    print(f"\n{TRIALS} kills: {TRIALS} complete with one finish reason; {same} identical to the uncut greedy answer")
    # greedy on one model: most continued answers are the uncut answer itself (16 of 20 in docs/BENCHMARKS.md, 3 of
    # 4 here; the others part where Gemma emits a turn marker); an answer started over is never identical
    assert same >= TRIALS // 3, f"{same} of {TRIALS} resumed answers identical to the uncut one"
