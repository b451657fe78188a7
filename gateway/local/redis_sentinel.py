"""A real Sentinel deployment on loopback from the embedded server: one master, its replicas, N sentinels (tests).

Every process is an EmbeddedRedis child on a free port: the master, each replica started with `--replicaof` the
master, each sentinel `redis-server <its own sentinel.conf> --sentinel` (Sentinel rewrites its config file: each
gets one in its own data dir) monitoring the master under `service` with a majority quorum. Then wait until every
sentinel knows the master, every replica and the other sentinels (they find each other through the master's
hello channel, every 2 s), and every replica is in sync.

`down_after_ms` is how long a master may not answer before a sentinel calls it down (Redis's default is 30 s; here
1 s) and `failover_timeout_ms` bounds a failover (default 3 min; here a few seconds): a test's failover then takes
two or three seconds.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.local.redis_server import EmbeddedRedis


def _client(port: int) -> redis.Redis:
    return redis.Redis("127.0.0.1", port, socket_timeout=1.0, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0))


class EmbeddedSentinels:
    """One master, `replicas` replicas and `sentinels` sentinels watching it as `service`."""

    def __init__(self, replicas: int = 1, sentinels: int = 3, *, service: str = "mymaster", down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, binary: str | Path | None = None,
                 start_timeout_s: float = 20.0) -> None:
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.start_timeout_s = start_timeout_s
        self._binary = binary
        self._replicas = replicas
        self._sentinels = sentinels
        self.nodes: list[EmbeddedRedis] = []  # the master first, then the replicas (until a failover swaps roles)
        self.sentinels: list[EmbeddedRedis] = []

    @property
    def url(self) -> str:
        """The gateway's Sentinel URL: every sentinel, then the service."""
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.service}"

    def _data_node(self, *extra: str) -> EmbeddedRedis:
        # a replica in sync at once, not after the default 5 s (every node may become a master)
        return EmbeddedRedis(self._binary, extra_args=("--repl-diskless-sync-delay", "0", *extra))

    def _sentinel(self, master: EmbeddedRedis) -> EmbeddedRedis:
        data_dir = Path(tempfile.mkdtemp(prefix="gateway-sentinel-"))
        conf = data_dir / "sentinel.conf"
        quorum = self._sentinels // 2 + 1
        conf.write_text(f"sentinel monitor {self.service} 127.0.0.1 {master.port} {quorum}\n"
                        f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                        f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                        f"sentinel parallel-syncs {self.service} 1\n")
        node = EmbeddedRedis(self._binary, config_file=conf, extra_args=("--sentinel",))
        node.data_dir = data_dir
        return node

    def start(self) -> EmbeddedSentinels:
        master = self._data_node().start()
        self.nodes = [master]
        for _ in range(self._replicas):
            self.nodes.append(self._data_node("--replicaof", "127.0.0.1", str(master.port)).start())
        for _ in range(self._sentinels):
            self.sentinels.append(self._sentinel(master).start())
        self._wait(self.healthy, "every sentinel to know the master, its replicas and each other")
        return self

    def _wait(self, check: Callable[[], bool], what: str, timeout_s: float | None = None) -> float:
        start = time.monotonic()
        deadline = start + (timeout_s or self.start_timeout_s)
        while True:
            try:
                if check():
                    return time.monotonic() - start
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Redis Sentinel: gave up waiting for {what} after {timeout_s or self.start_timeout_s} s")
            time.sleep(0.05)

    def _state(self, sentinel: EmbeddedRedis) -> dict[str, Any]:
        with _client(sentinel.port) as client:
            state: dict[str, Any] = client.sentinel_master(self.service)
        return state

    def master(self) -> EmbeddedRedis:
        """The node the first running sentinel names as the master now."""
        sentinel = next(s for s in self.sentinels if s.running)
        with _client(sentinel.port) as client:
            _, port = client.sentinel_get_master_addr_by_name(self.service)
        return next(node for node in self.nodes if node.port == int(port))

    def healthy(self) -> bool:
        """Every running sentinel names the same running master, not down, with every other running node as its
        replica in sync, and sees every other sentinel."""
        running = [s for s in self.sentinels if s.running]
        states = [self._state(s) for s in running]
        ports = {int(state["port"]) for state in states}
        if len(ports) != 1:
            return False
        master = next((node for node in self.nodes if node.port in ports and node.running), None)
        if master is None or any(s["is_sdown"] or s["is_odown"] or not s["is_master"] for s in states):
            return False
        with _client(master.port) as client:
            if client.info("replication").get("role") != "master":
                return False
        replicas = [node for node in self.nodes if node is not master and node.running]
        for node in replicas:
            with _client(node.port) as client:
                info = client.info("replication")
            if info.get("role") != "slave" or info.get("master_link_status") != "up" or \
                    int(info.get("master_port", 0)) != master.port:
                return False
        return all(int(s["num-slaves"]) >= len(replicas) and int(s["num-other-sentinels"]) >= len(running) - 1
                   for s in states)

    def wait_failover(self, old: EmbeddedRedis, timeout_s: float = 15.0) -> float:
        """Block until every running sentinel names a running master other than `old`; the seconds it took."""
        def promoted() -> bool:
            states = [self._state(s) for s in self.sentinels if s.running]
            ports = {int(state["port"]) for state in states}
            return len(ports) == 1 and old.port not in ports and all(
                state["is_master"] and not state["is_sdown"] for state in states)
        return self._wait(promoted, f"a replica promoted in place of :{old.port}", timeout_s)

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        return self._wait(self.healthy, "the master, every replica in sync and every sentinel", timeout_s)

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            node.stop()

    def __enter__(self) -> EmbeddedSentinels:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
