"""Issue 30: `gateway up` supervises what it starts: a backend that dies is logged, announced on the console
and restarted with backoff, and the gateway serves from it again; SIGTERM still stops everything."""

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil
from openai import OpenAI

from gateway.local.redis_server import free_ports
from tests.integration.test_cli import KEY, POLICY, routes, wait_ready


def start_up(tmp_path: Path, out: IO[bytes], *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    backend_port, gateway_port = free_ports(2)
    (tmp_path / "routes.yaml").write_text(routes(backend_port, launch=True))
    (tmp_path / "policy.yaml").write_text(POLICY)
    up = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--routes", "routes.yaml", "--policies",
                           "policy.yaml", "--port", str(gateway_port), "--no-redis", "--log-file", "requests.log",
                           *extra], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    return up, gateway_port


def test_a_killed_backend_is_restarted_and_serves_again(tmp_path: Path) -> None:
    console = tmp_path / "console.txt"
    with console.open("wb") as out:
        up, gateway_port = start_up(tmp_path, out)
        try:
            wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", up)
            [backend] = psutil.Process(up.pid).children()
            backend.kill()
            deadline = time.monotonic() + 60
            while "is healthy again" not in console.read_text() and time.monotonic() < deadline:
                assert up.poll() is None
                time.sleep(0.2)
            text = console.read_text()
            assert f"backend small-a exited with code {-signal.SIGKILL}" in text and "restarting in 1 s" in text
            [fresh] = psutil.Process(up.pid).children()
            assert fresh.pid != backend.pid
            client = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=KEY, max_retries=5)
            assert client.completions.create(model="small", prompt="hello", max_tokens=3).choices[0].text
        finally:
            up.send_signal(signal.SIGTERM)
            assert up.wait(timeout=20) == 0
    assert psutil.pid_exists(fresh.pid) is False or psutil.Process(fresh.pid).status() == psutil.STATUS_ZOMBIE


def test_with_no_restart_a_dead_backend_stays_dead(tmp_path: Path) -> None:
    """`gateway up --no-restart`: for a supervisor of the operator's own, and for fault drills."""
    console = tmp_path / "console.txt"
    with console.open("wb") as out:
        up, gateway_port = start_up(tmp_path, out, "--no-restart")
        try:
            wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", up)
            [backend] = psutil.Process(up.pid).children()
            backend.kill()
            time.sleep(2.5)
            assert up.poll() is None
            assert [p.status() for p in psutil.Process(up.pid).children()] == [psutil.STATUS_ZOMBIE]  # not restarted
        finally:
            up.send_signal(signal.SIGTERM)
            assert up.wait(timeout=20) == 0
    assert "restart" not in console.read_text()
