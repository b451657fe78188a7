"""Open a Redis client from one URL: single server, TLS, Sentinel or Cluster.

    redis://[[user]:password@]host:port[/db]           plain (any option redis-py's from_url knows)
    rediss://...                                       TLS
    redis+sentinel://[[user]:password@]host:port[,host:port...]/service_name[/db]
    redis+cluster://[[user]:password@]host:port        (rediss+cluster:// for TLS)

The client reconnects on its own: a command on a dead pooled connection is retried once, at once,
on a fresh connection (a restarted server is picked up by the next command). Everything else about
an unavailable Redis (timeouts, backoff) is `RedisGuard`'s job, so connects fail fast here.

A single server's pool holds at most POOL_SIZE connections, and a command waits for a free one
rather than opening more: under a burst, opening a connection per concurrent command is what made
Redis calls slow (100 concurrent calls on a cold pool: 217 ms unbounded, 60 ms over 16 connections,
one process; across three busy gateways up to 0.9 s per limiter call). A pool starved for the
socket timeout raises ConnectionError (Redis unavailable, to the guard).

A cluster client (`SeededCluster`, issue 41) is given every seed of the URL, and tries them all, in turn,
whenever it reads the slot map: at the first command, and again after a node fails (redis-py then keeps
the nodes the cluster announced; the configured seeds are added back, so a client whose known nodes all
moved still finds the cluster through a seed, e.g. a managed service's configuration endpoint). When a
node answers CLUSTERDOWN (or a slot is not covered, or MOVED keeps coming), redis-py closes *every*
connection of the client to force a fresh slot map: the calls in flight on the healthy masters then fail
("handler is closed"), and a node's failure becomes everyone's. `SeededCluster` turns that close, when it
comes from inside a command, into what it is for: read the slot map again before the next command; an
`aclose()` from outside (shutdown) still closes everything. And every slot-map refresh also re-reads the
server's whole command table (COMMAND: 60-300 ms of parsing here, during which every command of the client
waits on the refresh lock, so healthy masters' calls missed their budget in a failover): it is read once.

Sentinel: every sentinel of the URL is asked for the master (in turn, the first to answer wins), on
every new connection; a connection to a master that was demoted is dropped on READONLY and the next
one asks the sentinels again (redis-py's SentinelManagedConnection). The master's pool is capped as a
single server's is (POOL_SIZE, a command waits for a free connection): redis-py's Sentinel pool opens up to
100 and then raises "Too many connections", a ConnectionError the guard took for Redis down (every tenant
local) when a burst met a cold pool, e.g. right after a failover. The clients asking the sentinels are
capped too (SENTINEL_POOL_SIZE each, waiting the same way) and retry nothing: a sentinel that refuses is
passed over at once (redis-py's default client retried ten times with backoff: 2.9 s per new master
connection while the first sentinel of the URL was down, past every Redis budget of the gateway).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs, unquote

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis._parsers.commands import AsyncCommandsParser
from redis.backoff import NoBackoff

RedisClient = Redis | RedisCluster
_IN_COMMAND: ContextVar[bool] = ContextVar("redis_cluster_in_command", default=False)
POOL_SIZE = 32  # connections per gateway process to a single server (or a Sentinel-managed master)
SENTINEL_POOL_SIZE = 4  # connections per gateway process to each sentinel (asked once per new master connection)
Kind = Literal["single", "sentinel", "cluster"]
SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis": ("single", False), "rediss": ("single", True), "unix": ("single", False),
    "redis+sentinel": ("sentinel", False), "rediss+sentinel": ("sentinel", True),
    "redis+cluster": ("cluster", False), "rediss+cluster": ("cluster", True),
}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis URL."""

    kind: Kind
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    service: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    sentinel_password: str | None = None


def _host_port(item: str, default_port: int, url: str) -> tuple[str, int]:
    host, sep, port = item.rpartition(":") if not item.endswith("]") else (item, "", "")
    if not sep:
        host, port = item, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"Cannot parse Redis URL {url!r}: bad host:port {item!r}")
    return host, int(port)


def parse_url(url: str) -> RedisTarget:
    """Parse a Redis URL; raises ValueError naming the URL and the reason."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"Cannot parse Redis URL {url!r}: scheme must be one of {', '.join(SCHEMES)}")
    kind, tls = SCHEMES[scheme.lower()]
    if kind == "single":
        return RedisTarget(kind, url, tls=tls)
    rest, _, query = rest.partition("?")
    userinfo, at, hostlist = rest.rpartition("@")
    if not at:
        hostlist = rest
    hostlist, _, path = hostlist.partition("/")
    username, colon, password = userinfo.partition(":")
    default_port = 26379 if kind == "sentinel" else 6379
    hosts = tuple(_host_port(item, default_port, url) for item in hostlist.split(",") if item)
    if not hosts:
        raise ValueError(f"Cannot parse Redis URL {url!r}: no host")
    parts = [unquote(part) for part in path.split("/") if part]
    service, db = None, 0
    if kind == "sentinel":
        if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(f"Cannot parse Redis URL {url!r}: path must be /service_name[/db]")
        service, db = parts[0], int(parts[1]) if len(parts) == 2 else 0
    elif parts:
        raise ValueError(f"Cannot parse Redis URL {url!r}: a cluster URL has no path (no db in cluster mode)")
    sentinel_password = parse_qs(query).get("sentinel_password", [None])[0]
    return RedisTarget(kind, url, hosts, service, db, unquote(username) or None,
                       unquote(password) if colon else None, tls, sentinel_password)


class SeededCluster(RedisCluster):
    """RedisCluster that tries every configured seed and never closes itself under its callers' feet."""

    def __init__(self, seeds: tuple[tuple[str, int], ...], **options: Any) -> None:
        self.seeds = seeds
        super().__init__(startup_nodes=[ClusterNode(host, port) for host, port in seeds], **options)
        self.commands_parser = _CommandTableOnce()

    async def initialize(self, additional_startup_nodes_info: list[tuple[str, int]] | None = None,
                         last_failed_node_name: str | None = None) -> RedisCluster:
        known = set(self.nodes_manager.startup_nodes)
        extra = [*(additional_startup_nodes_info or []),
                 *(seed for seed in self.seeds if f"{seed[0]}:{seed[1]}" not in known)]
        return await super().initialize(additional_startup_nodes_info=extra or None,
                                        last_failed_node_name=last_failed_node_name)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        token = _IN_COMMAND.set(True)
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            _IN_COMMAND.reset(token)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> ClusterPipeline:
        return _Pipeline(self, transaction=transaction)  # type: ignore[abstract]  # redis-py's stubs

    async def aclose(self) -> None:
        if _IN_COMMAND.get():  # redis-py's way to force a new slot map: read it before the next command
            self._initialize = True
            return
        await super().aclose()


class _CommandTableOnce(AsyncCommandsParser):
    """The command table does not change with the slot map: read it at the first refresh only."""

    async def initialize(self, node: ClusterNode | None = None) -> None:
        if node is not None:
            self.node = node  # COMMAND GETKEYS goes to a live node
        if not self.commands:
            await super().initialize(node)


class _Pipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        token = _IN_COMMAND.set(True)
        try:
            result: list[Any] = await super().execute(raise_on_error, allow_redirections)
            return result
        finally:
            _IN_COMMAND.reset(token)


def connect(
    url: str, *, connect_timeout_s: float = 0.5, socket_timeout_s: float = 2.0, health_check_interval_s: int = 30,
) -> RedisClient:
    """A client for `url` (nothing is sent until the first command). Responses are bytes."""
    target = parse_url(url)
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s, "socket_timeout": socket_timeout_s,
        "health_check_interval": health_check_interval_s, "retry": Retry(NoBackoff(), 1),
    }
    if target.kind == "single":
        pool = BlockingConnectionPool.from_url(url, max_connections=POOL_SIZE, timeout=socket_timeout_s, **options)
        return Redis.from_pool(pool)  # the client owns the pool: aclose() closes it
    if target.kind == "cluster":
        # require_full_coverage=False: a slot map with a master's slots missing still serves the others
        return SeededCluster(target.hosts, ssl=target.tls, username=target.username, password=target.password,
                             require_full_coverage=False, **options)
    sentinel_options: dict[str, Any] = {"socket_connect_timeout": connect_timeout_s, "socket_timeout": socket_timeout_s,
                                        "password": target.sentinel_password}
    sentinel = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_options, **options)  # type: ignore[no-untyped-call]
    sentinel_class = SSLConnection if target.tls else Connection
    sentinel.sentinels = [  # the same clients, on capped pools
        Redis.from_pool(BlockingConnectionPool(connection_class=sentinel_class, host=host, port=port,
                                               max_connections=SENTINEL_POOL_SIZE, timeout=socket_timeout_s,
                                               **sentinel_options))
        for host, port in target.hosts]
    assert target.service is not None
    client: Redis = sentinel.master_for(target.service, connection_pool_class=BlockingSentinelPool, db=target.db,
                                        ssl=target.tls, username=target.username, password=target.password,
                                        max_connections=POOL_SIZE, timeout=socket_timeout_s)
    return client


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """redis-py's Sentinel pool (connections to whichever node the sentinels name as master) with the blocking
    pool's cap: at most `max_connections`, a command waits up to `timeout` for a free one."""
