"""Two identical replicas under a load one cannot carry alone, streams and non-streamed answers mixed: each
takes 35-65 % of the requests and the streams' p99 TTFT beats one replica's (issue 30: one non-streamed
answer, taken for a TTFT, used to send every later request to the other replica). Emulated backends without
/metrics, like llama.cpp's; tests/integration/test_replica_balance_llama_cpp.py runs the same on real servers."""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack

from gateway.emulator.harness import serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.testing import gateway_config, tier
from tests.conftest import StartGateway
from tests.integration.replica_balance import BalanceRun, mixed_load

# one sequence at a time, 10 ms a token: a 16-token answer holds a replica ~0.17 s
SINGLE_SLOT = dataclasses.replace(get_profile("int4"), name="single-slot", max_running=1, tpot_1_s=0.01)
BALANCING = {"near_tie": 0.1, "explore_after_s": 5.0, "scrape_interval_s": 0.0}  # the production defaults,
# without /metrics (llama.cpp has none)


async def run_on(replicas: int, stack: AsyncExitStack, start_gateway: StartGateway) -> BalanceRun:
    urls = [f"{(await stack.enter_async_context(serve_emulator(SINGLE_SLOT, seed=i))).url}/v1"
            for i in range(replicas)]
    url = await start_gateway(gateway_config([tier("t", urls)], balancing=BALANCING))
    return await mixed_load(url, requests=24, concurrency=4, max_tokens=16, trigger_tokens=150,
                            run_name=f"{replicas} replicas", extra={"ignore_eos": True})


async def test_two_replicas_share_a_mixed_load_and_beat_one(stack: AsyncExitStack,
                                                             start_gateway: StartGateway) -> None:
    one = await run_on(1, stack, start_gateway)
    two = await run_on(2, stack, start_gateway)
    shares = {name: round(two.share(name), 2) for name in ("t-0", "t-1")}
    print(f"shares {shares} (trigger on {two.trigger_backend}); streams' p99 TTFT: two replicas "
          f"{two.p99_ttft_s():.3f} s, one {one.p99_ttft_s():.3f} s")  # pytest -s: docs/BENCHMARKS.md
    assert all(0.35 <= share <= 0.65 for share in shares.values()), (shares, two.trigger_backend)
    assert two.p99_ttft_s() < one.p99_ttft_s(), (two.p99_ttft_s(), one.p99_ttft_s())
