"""The guard's per-node view (issue 41): one master's failure is that master's; cluster errors classified."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from structlog.testing import capture_logs
from prometheus_client import CollectorRegistry
from redis.asyncio import BlockingConnectionPool, Redis
from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.sentinel import MasterNotFoundError

from gateway.cache.connection import POOL_SIZE, SENTINEL_POOL_SIZE, BlockingSentinelPool, SeededCluster, connect
from gateway.cache.guard import RedisGuard
from gateway.cache.nodes import SLOTS, WHOLE, Keys, Topology, classify
from gateway.experiments.shadow import PairStore, ShadowPair, pair_key
from gateway.routing.sessions import Held, SessionStore, redis_key


class FakeTopology:
    """Keys 'a*' live on master A (slots 0-8191), the rest on B; B fails over to C when `failed_over`."""

    cluster = object()  # a cluster: nodes by key

    def __init__(self) -> None:
        self.failed_over = False

    def _b(self) -> str:
        return "C:3" if self.failed_over else "B:2"

    def nodes_of(self, keys: Keys) -> set[str]:
        if keys is None:
            return {WHOLE}
        items = [keys] if isinstance(keys, (str, bytes)) else keys
        return {"A:1" if str(k).startswith("a") else self._b() for k in items}

    def blame(self, err: BaseException, targets: set[str]) -> set[str]:
        node = getattr(err, "node", None)
        return {node} if node else set(targets)

    def slots_by_master(self) -> dict[str, int]:
        return {"A:1": SLOTS // 2, self._b(): SLOTS // 2}

    def master(self) -> str | None:
        return None


def failing(err: BaseException, node: str | None = None) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        if node:
            err.node = node  # type: ignore[attr-defined]
        raise err
    return call


async def ok() -> str:
    return "ok"


@pytest.fixture
def guard() -> tuple[RedisGuard, FakeTopology, CollectorRegistry]:
    registry = CollectorRegistry()
    topology = FakeTopology()
    guard = RedisGuard(Redis(port=1), op_timeout_s=0.05, down_backoff_s=0.05, registry=registry)
    guard.topology = topology  # type: ignore[assignment]
    return guard, topology, registry


async def test_a_dead_master_skips_only_its_own_keys(guard: tuple[RedisGuard, FakeTopology, CollectorRegistry]) -> None:
    g, _, registry = guard
    assert await g.run("get", failing(RedisConnectionError("refused"), "B:2"), key="b1") is None
    calls = 0

    async def counted() -> str:
        nonlocal calls
        calls += 1
        return "ok"

    assert [await g.run("get", counted, key="a1") for _ in range(5)] == ["ok"] * 5  # A's keys go on
    assert [await g.run("get", counted, key="b2") for _ in range(5)] == [None] * 5 and calls == 5  # B's skipped
    assert g.up_for("a1") and not g.up_for("b1") and not g.up
    status = g.status()
    assert (status.state, status.nodes_down, status.slots_unavailable) == ("partial", ("B:2",), SLOTS // 2)
    assert registry.get_sample_value("gateway_redis_node_up", {"node": "B:2"}) == 0
    assert registry.get_sample_value("gateway_redis_slots_unavailable") == SLOTS // 2
    assert registry.get_sample_value("gateway_redis_up") == 0


async def test_a_probe_that_meets_clusterdown_keeps_the_node_down(
    guard: tuple[RedisGuard, FakeTopology, CollectorRegistry],
) -> None:
    """Before: CLUSTERDOWN fell to the catch-all, whose probe marked Redis up again (flapping each second)."""
    g, _, registry = guard
    down = failing(ClusterDownError("CLUSTERDOWN The cluster is down"), "B:2")
    for _ in range(4):
        assert await g.run("get", down, key="b1") is None
        assert not g.up_for("b1")
        await asyncio.sleep(0.06)  # the backoff: the next call is the probe
    assert registry.get_sample_value("gateway_redis_error_kinds_total", {"kind": "cluster_down"}) == 4
    assert await g.run("get", ok, key="b1") == "ok" and g.up


async def test_a_failed_over_master_is_forgotten_and_its_keys_served_by_the_new_one(
    guard: tuple[RedisGuard, FakeTopology, CollectorRegistry],
) -> None:
    g, topology, _ = guard
    assert await g.run("get", failing(RedisConnectionError("refused"), "B:2"), key="b1") is None
    topology.failed_over = True  # the replica C took B's slots (the client's slot map says so)
    assert g.up_for("b1") and await g.run("get", ok, key="b1") == "ok"
    status = g.status()
    assert (status.state, status.nodes_down, status.slots_unavailable) == ("up", (), 0) and g.up


async def test_moved_and_a_closed_handler_leave_the_node_up(
    guard: tuple[RedisGuard, FakeTopology, CollectorRegistry],
) -> None:
    g, _, _ = guard
    for err in (MovedError("3999 127.0.0.1:6381"), ClusterError("TTL exhausted."),
                RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")):
        assert await g.run("get", failing(err, "B:2"), key="b1") is None
        assert g.up


async def test_the_whole_cluster_unreachable_skips_every_key(
    guard: tuple[RedisGuard, FakeTopology, CollectorRegistry],
) -> None:
    g, _, _ = guard
    assert await g.run("get", failing(RedisClusterException("Redis Cluster cannot be connected")), key=None) is None
    g.topology = type("T", (FakeTopology,), {"blame": lambda self, err, targets: {WHOLE}})()
    assert await g.run("get", failing(RedisClusterException("cannot be connected")), key="a1") is None
    assert await g.run("get", ok, key="a1") is None and await g.run("get", ok, key="b1") is None
    assert g.status().state == "down" and g.status().slots_unavailable == SLOTS


@pytest.mark.parametrize(("err", "kind"), [
    (RedisConnectionError("refused"), "unavailable"), (OSError("reset"), "unavailable"),
    (RedisClusterException("cannot be connected"), "unavailable"),
    (ClusterDownError("CLUSTERDOWN"), "cluster_down"), (SlotNotCoveredError("slot"), "cluster_down"),
    (TryAgainError("TRYAGAIN"), "failover"), (BusyLoadingError("LOADING"), "failover"),
    (ReadOnlyError("READONLY"), "failover"), (MovedError("1 h:1"), "moved"), (AskError("1 h:1"), "moved"),
    (ClusterError("TTL exhausted."), "moved"), (RuntimeError("the handler is closed"), "closed"),
    (ResponseError("WRONGTYPE"), "other"),
    # Sentinel: no sentinel knows a master; a demoted master answered READONLY (redis-py re-raises it so)
    (MasterNotFoundError("No master found for 'mymaster'"), "unavailable"),
    (RedisConnectionError("The previous master is now a slave"), "unavailable"),
])
def test_errors_are_classified(err: BaseException, kind: str) -> None:
    assert classify(err) == kind


async def test_a_cluster_url_gives_the_client_every_seed() -> None:
    client = connect("redis+cluster://127.0.0.1:1,127.0.0.1:2,[::1]:3")
    assert isinstance(client, SeededCluster)
    assert set(client.nodes_manager.startup_nodes) == {"127.0.0.1:1", "127.0.0.1:2", "::1:3"}
    await client.aclose()


async def test_an_error_no_node_is_named_on_is_blamed_by_its_message_never_on_the_whole_cluster() -> None:
    """A pipeline's or a keyless call's connection error carries no node: before, it switched every master off."""
    client = connect("redis+cluster://127.0.0.1:1")
    topology = Topology(client)
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:57249. Connect call failed")
    assert topology.blame(refused, {WHOLE}) == {"127.0.0.1:57249"}
    assert topology.blame(RedisConnectionError("Connection reset by peer"), {WHOLE}) == set()
    assert topology.blame(RedisConnectionError("reset"), {"10.0.0.1:6379"}) == {"10.0.0.1:6379"}
    assert topology.blame(RedisClusterException("Redis Cluster cannot be connected"), {"10.0.0.1:6379"}) == {WHOLE}
    await client.aclose()


class SplitTopology(FakeTopology):
    """Keys naming tenant 'other' live on master B:2, the rest on A:1."""

    def nodes_of(self, keys: Keys) -> set[str]:
        if keys is None:
            return {WHOLE}
        items = [keys] if isinstance(keys, (str, bytes)) else keys
        return {"B:2" if "other" in str(k) else "A:1" for k in items}


class HalfFrozen:
    """A client whose calls on B's keys never answer (a frozen or unroutable master); A's answer at once."""

    def __init__(self) -> None:
        self.answered: list[str] = []

    async def _reply(self, key: str, value: Any) -> Any:
        if "other" in key:
            await asyncio.Event().wait()
        self.answered.append(key)
        return value

    def register_script(self, _: str) -> Callable[..., Awaitable[Any]]:
        async def script(keys: list[str], args: list[str]) -> Any:
            return await self._reply(keys[0], [f"{args[0]}|{args[1]}".encode(), None])
        return script

    async def get(self, key: str) -> Any:
        return await self._reply(key, b"1|large")

    async def xadd(self, key: str, fields: dict[str, Any], **_: Any) -> Any:
        return await self._reply(key, b"1-0")

    async def xrevrange(self, key: str, count: int) -> Any:
        return await self._reply(key, [(b"1-0", {b"json": b'{"tenant": "mine"}'})])


def pair(tenant: str) -> ShadowPair:
    return ShadowPair("2025-01-01T00:00:00Z", "r", tenant, None, None, "small", "large", "p", "a", "b", 1.0, None,
                      None, 0.0)


async def test_sessions_and_shadow_pairs_name_their_keys_so_a_dead_master_is_only_its_own() -> None:
    """Another tenant's session and shadow-pair keys live on a master that stopped answering: its calls time out
    again and again. Before, these calls named no key: their timeouts were the whole cluster's, which went down,
    and every tenant's session, pairs, limits and caches went with it. Now only B is down; A's keys go on."""
    client = HalfFrozen()
    g = RedisGuard(client, op_timeout_s=0.01, down_backoff_s=60, down_after_s=0.0)  # type: ignore[arg-type]
    g.topology = SplitTopology()  # type: ignore[assignment]
    sessions, pairs = SessionStore(g), PairStore(g, timeout_s=0.01)
    for _ in range(3):
        await sessions.hold("other:s1", Held(0, "small"), 60)
        await sessions.peek("other:s1")
        await pairs.add(pair("other"), 10)
        await pairs.recent("other")
    assert g.status().nodes_down == ("B:2",) and g.status().state == "partial"
    assert g.up_for(redis_key("mine:s1")) and g.up_for(pair_key("mine"))
    client.answered.clear()
    assert await sessions.hold("mine:s1", Held(1, "large"), 60) == (Held(1, "large"), None)
    assert await sessions.peek("mine:s2") == Held(1, "large")  # Redis's answer, not the (empty) local one
    assert await pairs.add(pair("mine"), 10) and await pairs.recent("mine") == [{"tenant": "mine"}]
    assert client.answered == [redis_key("mine:s1"), redis_key("mine:s2"), pair_key("mine"), pair_key("mine")]


async def test_a_sentinel_client_is_capped_like_a_single_server() -> None:
    """redis-py's own Sentinel pool opens up to 100 connections, then fails with "Too many connections" (a
    ConnectionError: Redis down to the guard); the gateway's waits for one of POOL_SIZE, and each sentinel's for
    one of SENTINEL_POOL_SIZE (tests/integration/test_redis_sentinel.py: 150 commands at once)."""
    client = connect("redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc")
    assert isinstance(client, Redis)
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelPool) and pool.max_connections == POOL_SIZE
    sentinels = pool.sentinel_manager.sentinels
    assert len(sentinels) == 2 and all(isinstance(s.connection_pool, BlockingConnectionPool)
                                       and s.connection_pool.max_connections == SENTINEL_POOL_SIZE for s in sentinels)
    await client.aclose()


async def test_behind_sentinel_readyz_names_the_dead_master_and_the_log_the_one_that_took_over() -> None:
    client = connect("redis+sentinel://127.0.0.1:1/svc")
    assert isinstance(client, Redis)
    pool = client.connection_pool
    g = RedisGuard(client, op_timeout_s=0.05, down_backoff_s=0.0)
    pool.master_address = ("10.0.0.1", 6379)  # type: ignore[attr-defined]  # the sentinels' answer, as last read
    assert g.topology.master() == "10.0.0.1:6379"
    with capture_logs() as logs:
        assert await g.run("get", failing(RedisConnectionError("refused")), key="k") is None
        status = g.status()
        assert (status.state, status.nodes_down, status.slots_unavailable) == ("down", ("10.0.0.1:6379",), SLOTS)
        pool.master_address = ("10.0.0.2", 6379)  # type: ignore[attr-defined]  # a replica promoted
        assert await g.run("get", ok, key="k") == "ok" and g.status().state == "up"
    assert [(e["event"], e.get("node"), e.get("to")) for e in logs] == [
        ("redis_unavailable", "10.0.0.1:6379", None), ("redis_failed_over", "10.0.0.1:6379", "10.0.0.2:6379")]
    await client.aclose()
