"""Two gateways on a real Redis Cluster (3 masters, 3 replicas, from the shipped server) through a master's
failure and the seed's (issue 41): limits exact across gateways while healthy; tenants whose keys live on the
healthy masters keep global limits and their cache hits through the failover (0 local decisions); /readyz
names the failing node; 0 5xx; recovery without a restart."""

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

from gateway.app import create_app
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.config import GatewayConfig, PolicyConfig
from gateway.local.redis_cluster import EmbeddedCluster
from gateway.local.redis_server import EmbeddedRedis, free_port
from gateway.state import GATEWAY
from gateway.testing import gateway_config, tier
from tests.conftest import StartApp, StartEmulator

pytestmark = pytest.mark.usefixtures("frozen_heap")  # no GC pass over earlier tests' heap mid-failover

TENANTS = [f"t{i}" for i in range(9)]
LIMIT = 6  # requests a minute, for the exactness check
BODY = {"model": "t", "messages": [{"role": "user", "content": "What is a KV cache?"}], "max_tokens": 4,
        "temperature": 0}


def key_of(tenant: str, phase: str = "") -> str:
    return f"sk-{tenant}{phase}"


def config(backend: str) -> GatewayConfig:
    # a budget no event-loop stall of a shared CI machine reaches (a dead node refuses at once: the budget
    # does not slow the failure path); a timeout would read as a lost cache hit on a healthy master
    base = gateway_config([tier("t", [f"{backend}/v1"])], redis_op_timeout_ms=1000)
    policy = base.policy.model_dump()
    tenants = []
    for name in TENANTS:  # `name` for the exact limit, `name`x for the traffic
        tenants.append({"name": name, "api_key_sha256": hashlib.sha256(key_of(name).encode()).hexdigest(),
                        "rate_limit": {"requests_per_min": LIMIT}})
        tenants.append({"name": f"{name}x", "api_key_sha256": hashlib.sha256(key_of(name, "x").encode()).hexdigest(),
                        "rate_limit": {"requests_per_min": 100000}})
    policy["tenants"] = [*policy["tenants"], *tenants]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(policy))


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(masters=3, replicas=1, node_timeout_ms=1000) as running:
        yield running


async def test_a_seed_down_at_start_is_passed_over(cluster: EmbeddedCluster) -> None:
    """The first seed refuses: the client reaches the cluster through the next one, on its first call."""
    dead = free_port()
    client = connect(f"redis+cluster://127.0.0.1:{dead}," + cluster.url.removeprefix("redis+cluster://"))
    guard = RedisGuard(client, op_timeout_s=2.0)
    try:
        start = time.perf_counter()
        assert await guard.run("set", lambda: client.set("rl:{seed}:k", "v"), key="rl:{seed}:k") is True
        assert time.perf_counter() - start < 1.0 and guard.up
    finally:
        await client.aclose()


class Traffic:
    """Requests from every tenant to both gateways, counted per tenant: statuses, cache hits."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str]) -> None:
        self.session, self.urls = session, urls
        self.statuses: Counter[int] = Counter()
        self.hits: dict[str, list[bool]] = {}
        self.sent = 0

    async def ask(self, key: str, url: str) -> tuple[int, bool]:
        async with self.session.post(f"{url}/v1/chat/completions", json=BODY,
                                     headers={"Authorization": f"Bearer {key}"}) as response:
            await response.read()
            self.statuses[response.status] += 1
            self.sent += 1
            return response.status, response.headers.get("x-gateway-cache") == "hit"

    async def round(self, tenants: list[str]) -> None:
        async def one(index: int, tenant: str) -> None:
            status, hit = await self.ask(key_of(tenant, "x"), self.urls[index % 2])
            if status == 200:
                self.hits.setdefault(tenant, []).append(hit)

        await asyncio.gather(*(one(i, t) for i, t in enumerate(tenants)))


async def readiness(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/readyz") as response:
        return dict(await response.json())


def masters_of(cluster: EmbeddedCluster, tenant: str) -> int:
    return cluster.master_of(f"rl:{{{tenant}}}:req:0").port


def response_keys(cluster: EmbeddedCluster) -> dict[bytes, int]:
    """Every stored answer's key and the port of the master holding it."""
    found = {}
    for port in cluster.master_ports():
        with redis.Redis(port=port) as client:
            for key in client.scan_iter("resp:*"):
                found[key] = port
    return found


def error_kinds(apps: list[Any]) -> list[dict[str, float]]:
    """Each gateway's Redis errors by kind (gateway_redis_error_kinds_total), for a failure's message."""
    return [{sample.labels["kind"]: sample.value for metric in app[GATEWAY].redis.registry.collect()
             if metric.name == "gateway_redis_error_kinds" for sample in metric.samples
             if sample.name.endswith("_total")} for app in apps]


async def through_failover(cluster: EmbeddedCluster, victim: EmbeddedRedis, traffic: Traffic, apps: list[Any],
                           session: aiohttp.ClientSession, answers: dict[str, bytes]) -> dict[str, Any]:
    """Kill `victim` (a master), drive traffic until the cluster and both gateways are healthy again."""
    port = victim.port
    on_victim = [t for t in TENANTS if masters_of(cluster, t + "x") == port]
    healthy = [t for t in TENANTS if t not in on_victim]
    cached_healthy = [t for t in TENANTS if cluster.master_of(answers[t].decode()).port != port]
    # the gateways run on this event loop: every blocking call of the test (the cluster's own sync client,
    # killing a process) goes to a thread, or it would stall their Redis calls past their budget
    before = [Counter(app[GATEWAY].limiter.local_decisions) for app in apps]
    traffic.hits.clear()
    await asyncio.to_thread(victim.kill)
    killed_at = time.monotonic()
    named, recovered_at, failed_over_at = set(), None, None
    while time.monotonic() - killed_at < 15:
        await traffic.round(TENANTS)
        states = [await readiness(session, url) for url in traffic.urls]
        for state in states:
            if state["redis"] == "partial":
                named.add((tuple(state["redis_nodes_down"]), state["redis_slots_unavailable"]))
        if failed_over_at is None and await asyncio.to_thread(cluster.healthy):
            failed_over_at = time.monotonic() - killed_at
        if failed_over_at is not None and all(s["redis"] == "up" and s["limits"] == "global" for s in states):
            recovered_at = time.monotonic() - killed_at
            break
        await asyncio.sleep(0.02)
    after = [Counter(app[GATEWAY].limiter.local_decisions) for app in apps]
    local = Counter[str]()
    for b, a in zip(before, after, strict=True):
        local.update(a - b)
    return {"port": port, "on_victim": on_victim, "healthy": healthy, "named": named, "local": local,
            "failed_over_s": failed_over_at, "recovered_s": recovered_at, "cached_healthy": cached_healthy,
            "misses": {t: traffic.hits[t].count(False) for t in TENANTS}}


async def test_two_gateways_through_a_master_failure_and_the_seeds(
        cluster: EmbeddedCluster, start_emulator: StartEmulator, start_app: StartApp) -> None:
    emulator = await start_emulator()
    apps = [create_app(config(emulator.url), redis_url=cluster.url) for _ in range(2)]
    urls = [await start_app(app) for app in apps]
    async with aiohttp.ClientSession() as session:
        traffic = Traffic(session, urls)
        # healthy: one limit for both gateways, exact (clear of a minute boundary: the window slides)
        if time.time() % 60 > 50:
            await asyncio.sleep(60 - time.time() % 60 + 0.5)
        exact = {t: Counter([(await traffic.ask(key_of(t), urls[i % 2]))[0] for i in range(LIMIT + 3)])
                 for t in TENANTS}
        assert all(counts == Counter({200: LIMIT, 429: 3}) for counts in exact.values()), exact
        answers: dict[str, bytes] = {}  # tenant -> the key of its stored answer (spread over the masters)
        for tenant in TENANTS:
            known = set(await asyncio.to_thread(response_keys, cluster))
            await traffic.round([tenant])
            for _ in range(50):
                if new := set(await asyncio.to_thread(response_keys, cluster)) - known:
                    answers[tenant] = new.pop()
                    break
                await asyncio.sleep(0.02)
        await traffic.round(TENANTS)
        assert all(all(h[1:]) for h in traffic.hits.values()), traffic.hits  # replayed from the cache

        # the seed (the first host of the URL) is a master: kill it, then (failed over) another master
        seed = next(node for node in cluster.nodes if f"127.0.0.1:{node.port}" in cluster.url.split(",")[0])
        runs = []
        for victim in (seed, next(n for n in cluster.nodes if n.port in cluster.master_ports() and n is not seed)):
            assert victim.port in cluster.master_ports()
            run = await through_failover(cluster, victim, traffic, apps, session, answers)
            runs.append(run)
            print(f"killed master :{run['port']} ({len(run['on_victim'])} tenants' limits on it): failed over in "
                  f"{run['failed_over_s']:.2f} s, both gateways ready with global limits in {run['recovered_s']:.2f} s;"
                  f" local decisions {dict(run['local'])}; cache misses {run['misses']}; /readyz said {sorted(run['named'])}")
            assert run["recovered_s"] is not None, run  # recovery without a restart
            # tenants on the healthy masters: global limits throughout
            assert sum(run["local"][t + "x"] for t in run["healthy"]) == 0, run
            assert run["on_victim"] and sum(run["local"][t + "x"] for t in run["on_victim"]) > 0, run
            # answers stored on the healthy masters: replayed throughout
            healthy_misses = {t: run["misses"][t] for t in run["cached_healthy"]}
            assert run["cached_healthy"] and not any(healthy_misses.values()), \
                f"misses on healthy masters {healthy_misses}; guards' error kinds {error_kinds(apps)}"
            # /readyz named the failing master and its slots
            assert (( f"127.0.0.1:{run['port']}",), 5461) in run["named"] or \
                   ((f"127.0.0.1:{run['port']}",), 5462) in run["named"], run
            await asyncio.to_thread(victim.restart)  # it comes back as a replica of the master that took over
            await asyncio.to_thread(cluster.wait_healthy, 10)
            await asyncio.sleep(0.3)
    assert traffic.statuses.keys() <= {200, 429} and traffic.statuses[200] > 0, traffic.statuses  # 0 5xx
