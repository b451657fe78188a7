"""`make run` writes a request log that `gateway costs` reads; its console output is not mistaken for one."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from pathlib import Path

from openai import OpenAI

from gateway.local.redis_server import free_ports
from tests.integration.test_cli import KEY, POLICY, routes, wait_ready

ROOT = Path(__file__).resolve().parents[2]


def make_run_args(target: str) -> list[str]:
    """The arguments `make TARGET` passes to `gateway up` after --routes and --policies."""
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), target], capture_output=True, text=True, check=True)
    line = next(line for line in dry.stdout.splitlines() if "gateway up " in line)
    args = shlex.split(line.split("gateway up ", 1)[1])
    return [arg for i, arg in enumerate(args) if arg not in ("--routes", "--policies")
            and (i == 0 or args[i - 1] not in ("--routes", "--policies"))]


def test_make_run_writes_the_request_log_that_costs_reads(tmp_path: Path) -> None:
    extra = make_run_args("run")
    assert extra == make_run_args("run-emulated") and "--log-file" in extra
    log_file = tmp_path / extra[extra.index("--log-file") + 1]
    backend_port, gateway_port = free_ports(2)
    (tmp_path / "routes.yaml").write_text(routes(backend_port, launch=True))
    (tmp_path / "policy.yaml").write_text(POLICY)
    console = tmp_path / "console.txt"
    with console.open("wb") as out:  # `make run > console.txt 2>&1`
        up = subprocess.Popen([sys.executable, "-m", "gateway", "up", "--routes", "routes.yaml", "--policies",
                               "policy.yaml", "--port", str(gateway_port), "--no-redis", *extra],
                              cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"http://127.0.0.1:{gateway_port}/readyz", up)
            client = OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key=KEY)
            assert client.completions.create(model="small", prompt="hello", max_tokens=3).choices[0].text
        finally:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=20)
    banner = console.read_text()
    assert f"Request log lines go to {extra[extra.index('--log-file') + 1]}" in banner
    readme = (ROOT / "README.md").read_text()
    assert f"go to `{extra[extra.index('--log-file') + 1]}`" in readme
    costs = [sys.executable, "-m", "gateway", "costs"]
    from_log = subprocess.run([*costs, str(log_file)], capture_output=True, text=True)
    assert from_log.returncode == 0 and "request lines counted: 1;" in from_log.stdout
    assert "Malformed lines skipped: 0 (" in from_log.stdout
    from_console = subprocess.run([*costs, str(console)], capture_output=True, text=True)
    assert "Malformed lines skipped: 0 (" in from_console.stdout
    assert "Text lines skipped" in from_console.stdout
