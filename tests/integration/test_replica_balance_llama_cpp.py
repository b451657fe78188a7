"""Issue 30's balance test on real llama.cpp servers (`llama-server`, Gemma 3 270M Q4_K_M, two slots and one
thread each, configured as routes/local.yaml configures them): after one long non-streamed answer, a mix of streams
and non-streamed answers, more at once than one server has slots. Each replica takes 35-65 % of the requests
and the streams' p99 TTFT beats one replica's. Kept short: a few dozen answers of 8 tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from gateway.config import Replica, RoutesConfig
from gateway.local.children import start_children, stop_children, wait_healthy
from gateway.local.redis_server import free_port
from gateway.testing import gateway_config
from tests.conftest import StartGateway
from tests.integration.replica_balance import BalanceRun, mixed_load

BALANCING = {"near_tie": 0.1, "explore_after_s": 5.0, "scrape_interval_s": 1.0}  # production defaults, local.yaml's
ADMISSION = {"initial_limit": 4, "min_limit": 2, "ttft_target_ms": 10000, "max_wait_ms": 30000}  # local.yaml's
MODEL = "gemma3-270m-q4_k_m"


@pytest.fixture(scope="module")
def two_servers() -> Iterator[RoutesConfig]:
    replicas = [{"name": f"t-{i}", "url": f"http://127.0.0.1:{free_port()}/v1", "model": MODEL,
                 "launch": {"kind": "llama_cpp", "model": MODEL, "n_threads": 1, "n_ctx": 1024, "parallel": 2}}
                for i in range(2)]
    routes = RoutesConfig.model_validate({"tiers": [{
        "name": "t", "precision": "int4", "context_window": 1024, "tokenizer": f"gguf:{MODEL}",
        "prices": {"input_per_mtok": 0.05, "output_per_mtok": 0.5}, "prefill_tokens_per_s": 146,
        "slots_per_replica": 2,  # = parallel, as routes/local.yaml says
        "replicas": replicas}]})
    children = start_children(routes)
    try:
        asyncio.run(wait_healthy(children, timeout_s=120))
        asyncio.run(warm([r.url for r in replicas_of(routes)]))
        yield routes
    finally:
        stop_children(children)


def replicas_of(routes: RoutesConfig) -> tuple[Replica, ...]:
    return routes.tiers[0].replicas


async def warm(urls: list[str]) -> None:
    """A first answer from each server: its weights paged in, its first (slow) request behind it, so the two
    start alike (this test is about sharing, not about a cold start)."""
    async with aiohttp.ClientSession() as session:
        for url in urls:
            for stream in (False, True):
                body = {"model": MODEL, "messages": [{"role": "user", "content": "Request: warm up."}],
                        "max_tokens": 8, "stream": stream}
                async with session.post(f"{url}/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                    await response.read()


async def run_on(routes: RoutesConfig, replicas: int, start_gateway: StartGateway) -> BalanceRun:
    tier = routes.tiers[0].model_copy(update={"replicas": routes.tiers[0].replicas[:replicas]})
    url = await start_gateway(gateway_config([tier], balancing=BALANCING, admission=ADMISSION))
    return await mixed_load(url, requests=28, concurrency=4, max_tokens=8, trigger_tokens=64,
                            run_name=f"{replicas} replicas")


async def test_two_llama_cpp_servers_share_a_mixed_load_and_beat_one(two_servers: RoutesConfig,
                                                                     start_gateway: StartGateway) -> None:
    one = await run_on(two_servers, 1, start_gateway)
    two = await run_on(two_servers, 2, start_gateway)
    shares = {name: round(two.share(name), 2) for name in ("t-0", "t-1")}
    print(f"shares {shares} (trigger on {two.trigger_backend}); streams' p99 TTFT: two replicas "
          f"{two.p99_ttft_s():.3f} s, one {one.p99_ttft_s():.3f} s")  # pytest -s: docs/BENCHMARKS.md
    assert all(0.35 <= share <= 0.65 for share in shares.values()), (shares, two.trigger_backend)
    assert two.p99_ttft_s() < one.p99_ttft_s(), (two.p99_ttft_s(), one.p99_ttft_s())
