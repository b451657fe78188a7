"""A gateway in front of emulators, started for a benchmark: config files, processes, readiness.

    stack = start_stack(procs, tmp, lambda urls: routes_yaml({"t": [("t-a", urls[0])]}), policy_text)

Emulators `emulator-I` (profile `profile`, seeds seed, seed + 1, ...) on this process's CPUs, the
gateway (`gateway serve`, taskset to `gw_cpu`) on routes and policy files in `tmp`/config (the
folder the gateway watches for hot reload: the busy request log lives beside it, not in it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.bench.procs import Procs, emulator_argv, free_port, gateway_argv, wait_gateway, wait_http


@dataclass(frozen=True, slots=True)
class Stack:
    emulator_ports: list[int]
    emulator_pids: list[int]
    gateway_port: int
    gateway_pid: int
    request_log: Path

    @property
    def emulator_urls(self) -> list[str]:
        """Each emulator's base URL (…/v1)."""
        return [f"http://127.0.0.1:{port}/v1" for port in self.emulator_ports]

    @property
    def gateway_url(self) -> str:
        """The gateway's base URL (…/v1)."""
        return f"http://127.0.0.1:{self.gateway_port}/v1"


def start_stack(procs: Procs, tmp: Path, routes: Callable[[Sequence[str]], str], policy: str, *, emulators: int = 1,
                profile: str = "instant", seed: int = 1, redis_url: str | None = None, gw_cpu: int | None = None,
                gateway_timeout_s: float = 60) -> Stack:
    """Start `emulators` emulators, and once they answer a gateway on `routes(emulator base URLs)` and
    `policy`; wait until it answers too."""
    ports = [free_port() for _ in range(emulators)]
    emus = [procs.start(f"emulator-{i}", emulator_argv(port, profile, seed + i), None, tmp / f"emulator-{i}.out")
            for i, port in enumerate(ports)]
    config = tmp / "config"
    config.mkdir(exist_ok=True)
    (config / "routes.yaml").write_text(routes([f"http://127.0.0.1:{port}/v1" for port in ports]))
    (config / "policy.yaml").write_text(policy)
    for i, (port, proc) in enumerate(zip(ports, emus)):  # before the gateway: its first health probe must pass,
        wait_http(f"http://127.0.0.1:{port}/health", proc, f"emulator-{i}")  # else it starts with no replica
    gw_port, gw_pid = start_gateway(procs, tmp, "gateway", redis_url, gw_cpu, gateway_timeout_s)
    return Stack(ports, [e.pid for e in emus], gw_port, gw_pid, tmp / "requests.log")


def start_gateway(procs: Procs, tmp: Path, name: str, redis_url: str | None, gw_cpu: int | None,
                  timeout_s: float = 60, tree: Path | None = None) -> tuple[int, int]:
    """`gateway serve` on the routes and policy files in `tmp`/config, its request log `tmp`/requests.log; `tree`:
    the gateway package of another checkout (a `git worktree` of an earlier commit: its `python -m gateway`),
    else this one's. Waits until it answers; (port, pid)."""
    config, port = tmp / "config", free_port()
    argv = gateway_argv(config / "routes.yaml", config / "policy.yaml", port, tmp / "requests.log", redis_url, gw_cpu)
    gw = procs.start(name, argv, None, tmp / f"{name}.out", **({"cwd": tree} if tree is not None else {}))
    wait_gateway(port, gw, timeout_s)
    return port, gw.pid
