"""A gateway behind a real Sentinel deployment (one master, one replica, three sentinels, from the shipped server)
through the master's death (issue 41): 0 5xx; limits local only from the kill until the promoted replica answers
the guard's next probe, global again after; the answers cached before the kill served by the new master; /readyz
names the dead master while Redis is down; the log says which node took over; recovery without a restart. And the
Sentinel client's connections are capped per process like a single server's."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import redis
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.cache.connection import POOL_SIZE, connect
from gateway.cache.guard import RedisGuard
from gateway.config import GatewayConfig, PolicyConfig
from gateway.local.redis_sentinel import EmbeddedSentinels
from gateway.local.redis_server import free_port
from gateway.state import GATEWAY
from gateway.testing import gateway_config, tier
from tests.conftest import StartApp, StartEmulator

pytestmark = pytest.mark.usefixtures("frozen_heap")  # no GC pass over earlier tests' heap mid-failover

TENANTS = [f"s{i}" for i in range(4)]
PROMPTS = ["What is a KV cache?", "What is paged attention?", "What is speculative decoding?"]


def key_of(tenant: str) -> str:
    return f"sk-sentinel-{tenant}"


def body(prompt: str) -> dict[str, Any]:
    return {"model": "t", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "temperature": 0}


def config(backend: str) -> GatewayConfig:
    base = gateway_config([tier("t", [f"{backend}/v1"])], redis_op_timeout_ms=250)
    policy = base.policy.model_dump()
    policy["tenants"] = [*policy["tenants"], *(
        {"name": name, "api_key_sha256": hashlib.sha256(key_of(name).encode()).hexdigest(),
         "rate_limit": {"requests_per_min": 100000}} for name in TENANTS)]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(policy))


@pytest.fixture(scope="module")
def sentinels() -> Iterator[EmbeddedSentinels]:
    with EmbeddedSentinels(replicas=1, sentinels=3, down_after_ms=1000, failover_timeout_ms=2000) as running:
        yield running


def keys_on(port: int, pattern: str) -> dict[bytes, bytes | None]:
    with redis.Redis(port=port, socket_timeout=1.0) as client:
        return {key: client.get(key) if pattern.startswith("rl:") else None for key in client.scan_iter(pattern)}


async def test_the_sentinel_client_caps_its_connections_per_process(sentinels: EmbeddedSentinels) -> None:
    """150 commands at once on a cold pool: each waits for one of POOL_SIZE connections. Before, redis-py's
    Sentinel pool opened 100 and failed the other 50 with "Too many connections" (a ConnectionError: the guard
    took Redis for down)."""
    client = connect(sentinels.url)
    try:
        replies = await asyncio.gather(*(client.blpop(["sentinel-cap-absent"], timeout=0.05) for _ in range(150)),
                                       return_exceptions=True)
        assert replies == [None] * 150, Counter(type(r).__name__ for r in replies)
        port = sentinels.master().port
        with redis.Redis(port=port) as admin:
            opened = [c for c in admin.client_list() if c["cmd"] == "blpop"]
        assert 0 < len(opened) <= POOL_SIZE, len(opened)
    finally:
        await client.aclose()


class Traffic:
    """Every tenant asks every cached prompt each round; statuses and cache hits counted per round."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.statuses: Counter[int] = Counter()

    async def ask(self, tenant: str, prompt: str) -> tuple[int, bool]:
        async with self.session.post(f"{self.url}/v1/chat/completions", json=body(prompt),
                                     headers={"Authorization": f"Bearer {key_of(tenant)}"}) as response:
            await response.read()
            self.statuses[response.status] += 1
            return response.status, response.headers.get("x-gateway-cache") == "hit"

    async def round(self) -> list[bool]:
        replies = await asyncio.gather(*(self.ask(t, p) for t in TENANTS for p in PROMPTS))
        return [hit for status, hit in replies if status == 200]

    async def ready(self) -> dict[str, Any]:
        async with self.session.get(f"{self.url}/readyz") as response:
            return dict(await response.json())


async def test_a_gateway_through_the_masters_death_and_a_sentinel_failover(
        sentinels: EmbeddedSentinels, start_emulator: StartEmulator, start_app: StartApp) -> None:
    emulator = await start_emulator()
    app = create_app(config(emulator.url), redis_url=sentinels.url)
    url = await start_app(app)
    limiter, guard = app[GATEWAY].limiter, app[GATEWAY].redis
    assert limiter is not None and guard is not None
    old = sentinels.master()
    async with aiohttp.ClientSession() as session:
        traffic = Traffic(session, url)
        await traffic.round()  # answers stored (in the background): wait until the master holds them all
        for _ in range(100):
            if len(await asyncio.to_thread(keys_on, old.port, "resp:*")) >= len(PROMPTS):
                break
            await asyncio.sleep(0.02)
        with redis.Redis(port=old.port) as admin:  # and its replica too, before the master dies
            assert admin.execute_command("WAIT", 1, 2000) == 1
        assert all(await traffic.round())  # every answer from the cache
        assert await traffic.ready() | {"redis": "up", "limits": "global"} == await traffic.ready()
        local_before = sum(limiter.local_decisions.values())

        # the gateway runs on this event loop: the test's blocking calls (sentinels, kill) go to threads
        with capture_logs() as logs:
            await asyncio.to_thread(old.kill)
            killed_at = time.monotonic()
            rounds: list[dict[str, Any]] = []
            promoted_s = recovered_s = None
            while time.monotonic() - killed_at < 15:
                hits = await traffic.round()
                state = await traffic.ready()
                at = time.monotonic() - killed_at
                rounds.append({"at": at, "hits": hits, "local": sum(limiter.local_decisions.values()), **state})
                if promoted_s is None and (await asyncio.to_thread(sentinels.master)).port != old.port:
                    promoted_s = at
                if recovered_s is None and state["redis"] == "up" and rounds[-1]["local"] > local_before:
                    recovered_s = at
                if recovered_s is not None and at - recovered_s > 1.0:  # a second more of traffic after
                    break
                await asyncio.sleep(0.05)
        new = await asyncio.to_thread(sentinels.master)
        down = [r for r in rounds if r["redis"] == "down"]
        after = [r for r in rounds if recovered_s is not None and r["at"] > recovered_s]  # rounds sent once up
        print([(round(r["at"], 2), r["redis"], r["local"] - local_before, sum(r["hits"])) for r in rounds])
        print(f"master :{old.port} killed: sentinels promoted :{new.port} after {promoted_s:.2f} s; gateway up with "
              f"global limits after {recovered_s:.2f} s; {len(rounds)} rounds, local decisions "
              f"{rounds[-1]['local'] - local_before}; hits while down {sum(sum(r['hits']) for r in down)}/"
              f"{sum(len(r['hits']) for r in down)}, after {sum(sum(r['hits']) for r in after)}/"
              f"{sum(len(r['hits']) for r in after)}; /readyz while down: "
              f"{sorted({(r['redis'], r['limits'], tuple(r['redis_nodes_down'])) for r in down})}; "
              f"statuses {dict(traffic.statuses)}")
        assert traffic.statuses.keys() == {200}, traffic.statuses  # 0 5xx (limits are far)
        assert promoted_s is not None and recovered_s is not None, rounds  # recovery without a restart
        # local only during the failover: from the first failed call until the probe after the promotion
        assert rounds[-1]["local"] > local_before
        assert all(r["local"] == after[0]["local"] for r in after), after
        assert recovered_s - promoted_s <= 2.0, (promoted_s, recovered_s)  # the 1 s backoff and a round
        assert down and all(r["limits"] == "local" and r["redis_nodes_down"] == [f"127.0.0.1:{old.port}"]
                            and r["redis_slots_unavailable"] == 16384 for r in down), down
        assert all(r["redis"] == "up" and r["limits"] == "global" for r in after), after
        # the answers cached before the kill, served by the promoted replica
        assert after and all(all(r["hits"]) and len(r["hits"]) == len(TENANTS) * len(PROMPTS) for r in after)
        events = [(e["event"], e.get("node"), e.get("to")) for e in logs if e["event"].startswith("redis_")]
        print("logged:", [(e["event"], e.get("node"), e.get("to"), e.get("down_s"), e.get("error", "")[:90])
                          for e in logs if e["event"].startswith(("redis_", "limits_"))])
        assert ("redis_failed_over", f"127.0.0.1:{old.port}", f"127.0.0.1:{new.port}") in events, events
        assert ("redis_unavailable", f"127.0.0.1:{old.port}", None) in events, events
        # global limits: the limiter counts on the new master
        counted = await asyncio.to_thread(keys_on, new.port, "rl:{s0}:req:*")
        before_more = sum(int(v or 0) for v in counted.values())
        await traffic.round()
        counted = await asyncio.to_thread(keys_on, new.port, "rl:{s0}:req:*")
        assert sum(int(v or 0) for v in counted.values()) == before_more + len(PROMPTS), counted

        # the old master comes back (as a master, until the sentinels turn it into a replica): nothing changes
        await asyncio.to_thread(old.restart)
        for _ in range(10):
            assert all(await traffic.round())
            assert (await traffic.ready())["redis"] == "up"
            await asyncio.sleep(0.05)
        assert guard.topology.master() == f"127.0.0.1:{new.port}"
    assert traffic.statuses.keys() == {200}, traffic.statuses


async def test_a_sentinel_down_is_passed_over(sentinels: EmbeddedSentinels) -> None:
    """The first sentinel of the URL refuses: the next one names the master, on the first call."""
    dead = free_port()
    client = connect(sentinels.url.replace("redis+sentinel://", f"redis+sentinel://127.0.0.1:{dead},"))
    guard = RedisGuard(client, op_timeout_s=2.0)
    try:
        start = time.perf_counter()
        assert await guard.run("set", lambda: client.set("sentinel-seed", "v"), key="sentinel-seed") is True
        print(f"first call past a dead sentinel: {time.perf_counter() - start:.3f} s")
        assert time.perf_counter() - start < 1.0 and guard.up
    finally:
        await client.aclose()
