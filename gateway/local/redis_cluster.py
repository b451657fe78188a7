"""A real Redis Cluster on loopback from the embedded server: N masters, R replicas each (tests, local runs).

No `redis-cli --cluster create` ships with the server, so the cluster is formed by hand, as that tool does:
every node started with `cluster-enabled yes`, its bus on a port chosen free (`cluster-port`, not
port+10000: that one may be taken), CLUSTER MEET from the first node to the others, the 16384 slots split
evenly over the masters (CLUSTER ADDSLOTSRANGE), each replica told CLUSTER REPLICATE, then wait until
every node reports `cluster_state:ok` and knows every other node.

`cluster-require-full-coverage no`: the healthy masters keep serving their slots while one master's slots
have no owner (what an SRE sets, and what lets tenants on healthy masters keep their global limits);
`cluster-node-timeout` small so a test's failover takes a second or two, not fifteen.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.local.redis_server import EmbeddedRedis, free_port

SLOTS = 16384


def _client(port: int) -> redis.Redis:
    return redis.Redis("127.0.0.1", port, socket_timeout=1.0, socket_connect_timeout=1.0,
                       retry=Retry(NoBackoff(), 0))


class EmbeddedCluster:
    """`masters` masters with `replicas` replicas each, every node an EmbeddedRedis child."""

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 1000,
                 binary: str | Path | None = None, start_timeout_s: float = 20.0, full_coverage: bool = False) -> None:
        self.node_timeout_ms = node_timeout_ms
        self.start_timeout_s = start_timeout_s
        self.nodes: list[EmbeddedRedis] = []
        self.masters = masters
        self.replicas = replicas
        self._binary = binary
        self.full_coverage = full_coverage  # True: Redis's default, every node refuses all keys while a slot is lost

    def _node(self) -> EmbeddedRedis:
        options = ("--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                   "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
                   "--cluster-require-full-coverage", "yes" if self.full_coverage else "no", "--cluster-allow-reads-when-down", "no",
                   "--repl-diskless-sync-delay", "0")  # a replica in sync at once, not after 5 s
        return EmbeddedRedis(self._binary, extra_args=options)

    @property
    def url(self) -> str:
        """redis+cluster:// with every node as a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> EmbeddedCluster:
        count = self.masters * (1 + self.replicas)
        self.nodes = [self._node().start() for _ in range(count)]
        with _client(self.nodes[0].port) as first:
            for node in self.nodes[1:]:
                first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, self._bus_port(node))
        per = SLOTS // self.masters
        for index, node in enumerate(self.nodes[:self.masters]):
            low, high = index * per, SLOTS - 1 if index == self.masters - 1 else (index + 1) * per - 1
            with _client(node.port) as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
        ids = [self.node_id(node) for node in self.nodes]
        self._wait(lambda: all(self._knows(node, count) for node in self.nodes), "every node to know the others")
        for index, node in enumerate(self.nodes[self.masters:]):
            with _client(node.port) as client:
                client.execute_command("CLUSTER", "REPLICATE", ids[index % self.masters])
        self._wait(self.healthy, "cluster_state:ok on every node")
        self._wait(self.replicas_in_sync, "every replica in sync with its master")
        return self

    def _bus_port(self, node: EmbeddedRedis) -> int:
        args = list(node.extra_args)
        return int(args[args.index("--cluster-port") + 1])

    def node_id(self, node: EmbeddedRedis) -> str:
        with _client(node.port) as client:
            return _text(client.execute_command("CLUSTER", "MYID"))

    def _knows(self, node: EmbeddedRedis, count: int) -> bool:
        with _client(node.port) as client:
            return len(_text(client.execute_command("CLUSTER", "NODES")).strip().splitlines()) == count

    def _wait(self, check: object, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                if callable(check) and check():
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis Cluster: gave up waiting for {what} after {self.start_timeout_s} s")
            time.sleep(0.05)

    def state(self, node: EmbeddedRedis) -> str:
        with _client(node.port) as client:
            info = _text(client.execute_command("CLUSTER", "INFO"))
        return next((line.split(":", 1)[1].strip() for line in info.splitlines()
                     if line.startswith("cluster_state:")), "unknown")

    def healthy(self) -> bool:
        """Every running node says cluster_state:ok and every slot has a master that is up."""
        running = [node for node in self.nodes if node.running]
        if not all(self.state(node) == "ok" for node in running):
            return False
        masters, up = self.master_ports(), {node.port for node in running}
        return len(masters) == self.masters and set(masters) <= up

    def replicas_in_sync(self) -> bool:
        """Every running replica's link to its master is up (a replica can take over only then)."""
        for node in self.nodes:
            if node.running:
                with _client(node.port) as client:
                    info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
        return True

    def master_ports(self) -> list[int]:
        """Ports of the masters serving slots, as a running node sees them (not failed ones)."""
        node = next(node for node in self.nodes if node.running)
        with _client(node.port) as client:
            lines = _text(client.execute_command("CLUSTER", "NODES")).strip().splitlines()
        ports = []
        for line in lines:
            fields = line.split()
            flags = fields[2].split(",")
            if "master" in flags and "fail" not in flags and len(fields) > 8:
                ports.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return ports

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node serving `key`'s slot now."""
        node = next(node for node in self.nodes if node.running)
        with _client(node.port) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for low, high, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if low <= slot <= high:
                    port = int(master[1])
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(key)

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        """Block until healthy() (a failover done, a node back); returns the seconds it took."""
        start = time.monotonic()
        saved = self.start_timeout_s
        self.start_timeout_s = timeout_s or saved
        try:
            self._wait(self.healthy, "cluster_state:ok on every node")
        finally:
            self.start_timeout_s = saved
        return time.monotonic() - start

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
