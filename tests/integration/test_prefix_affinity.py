"""Prefix affinity through Redis: a growing conversation stays on one replica, across gateway replicas."""

import asyncio

import aiohttp
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

SYSTEM = "You are a careful assistant for a platform team. Answer briefly and cite the runbook section. " * 2


async def converse(session: aiohttp.ClientSession, urls: list[str], turns: int, topic: str) -> list[str]:
    """One conversation, each turn sent to the next gateway in `urls`: the backend of each turn."""
    messages = [{"role": "system", "content": SYSTEM}]
    backends = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{topic}: question number {turn} about the incident"})
        body = {"model": "t", "messages": messages, "max_tokens": 3}
        async with session.post(f"{urls[turn % len(urls)]}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            answer = await response.json()
            backends.append(response.headers["x-gateway-backend"])
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        await asyncio.sleep(0.05)  # the prefix record is written after the answer
    return backends


async def test_a_conversation_sticks_to_its_replica_across_gateways(start_emulator: StartEmulator,
                                                                    start_app: StartApp, redis_url: str) -> None:
    replicas = [f"{(await start_emulator(seed=i)).url}/v1" for i in range(3)]
    config = gateway_config([tier("t", replicas)])
    gateways = [await start_app(create_app(config, redis_url=redis_url)) for _ in range(2)]
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            first = await converse(session, gateways, 6, "disk full on node 7")
            second = await converse(session, gateways, 6, "certificate expiry on the ingress")
    assert len(set(first)) == 1 and len(set(second)) == 1
    later_turns = [e for e in logs if e["event"] == "request"][1:6]
    assert all(e["prefix_blocks"] > 0 for e in later_turns)


async def test_without_redis_the_replicas_take_turns(start_emulator: StartEmulator, start_app: StartApp) -> None:
    replicas = [f"{(await start_emulator(seed=i)).url}/v1" for i in range(3)]
    config = gateway_config([tier("t", replicas)], balancing={"near_tie": 0.1})
    gateway = await start_app(create_app(config))
    async with aiohttp.ClientSession() as session:
        backends = await converse(session, [gateway], 6, "disk full on node 7")
    # the control: equally fast replicas are near-ties, and of two drawn the less recently picked
    # goes, so without affinity a conversation never stays on one replica
    assert len(set(backends)) >= 2
