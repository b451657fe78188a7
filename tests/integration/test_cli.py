"""The README's path as real processes: `gateway emulate`, `gateway serve --log-file`, `gateway up`."""

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest
from openai import OpenAI

from gateway.local.redis_server import free_ports
from gateway.testing import routes_yaml

KEY = "sk-cli"
POLICY = f"""
default_tier: small
max_tokens: {{default: 8, maximum: 64}}
tenants:
  - {{name: cli, api_key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}}}
"""



def routes(port: int, launch: bool) -> str:
    return routes_yaml(f"http://127.0.0.1:{port}/v1", tier_name="small",
                       launch="{kind: emulator, profile: instant}" if launch else "")


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"process exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} not ready after {timeout_s} s")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def gateway_cli(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gateway", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_emulate_and_serve_stream_with_the_openai_client(tmp_path: Path,
                                                         processes: list[subprocess.Popen[bytes]]) -> None:
    backend_port, gateway_port = free_ports(2)
    (tmp_path / "routes.yaml").write_text(routes(backend_port, launch=False))
    (tmp_path / "policy.yaml").write_text(POLICY)
    log_file = tmp_path / "requests.log"
    processes.append(gateway_cli("emulate", "--port", str(backend_port), "--profile", "instant"))
    processes.append(gateway_cli("serve", "--routes", str(tmp_path / "routes.yaml"), "--policies",
                                 str(tmp_path / "policy.yaml"), "--port", str(gateway_port),
                                 "--log-file", str(log_file)))
    wait_ready(f"http://127.0.0.1:{backend_port}/health", processes[0])
    wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", processes[1])
    client = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=KEY)
    stream = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text
    processes[1].send_signal(signal.SIGTERM)
    assert processes[1].wait(timeout=10) == 0
    lines = [orjson.loads(line) for line in log_file.read_bytes().splitlines()]
    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) == 1
    assert requests[0]["tenant"] == "cli" and requests[0]["completion_tokens"] == 8  # the policy's default
    assert requests[0]["cost_usd"] > 0


def test_up_starts_backends_and_stops_them_on_sigterm(tmp_path: Path,
                                                       processes: list[subprocess.Popen[bytes]]) -> None:
    backend_port, gateway_port = free_ports(2)
    (tmp_path / "routes.yaml").write_text(routes(backend_port, launch=True))
    (tmp_path / "policy.yaml").write_text(POLICY)
    up = gateway_cli("up", "--routes", str(tmp_path / "routes.yaml"), "--policies", str(tmp_path / "policy.yaml"),
                     "--port", str(gateway_port), "--log-file", str(tmp_path / "log"))
    processes.append(up)
    wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", up)
    children = psutil.Process(up.pid).children(recursive=True)
    assert children, "gateway up started no backend"
    client = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=KEY)
    assert client.completions.create(model="small", prompt="hello", max_tokens=3).choices[0].text
    up.send_signal(signal.SIGTERM)
    assert up.wait(timeout=20) == 0
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == [], f"orphans left: {[p.pid for p in alive]}"
    assert b"curl" in up.stderr.read() if up.stderr else False
