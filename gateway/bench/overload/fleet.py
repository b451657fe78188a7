"""The processes of bench/overload.py: a fleet of `overload` emulators behind one gateway.

Each measured point gets a fresh fleet (new emulators, new gateway, Redis flushed), so no point
inherits another's prefix caches, learned replica statistics or adaptive limit. The gateway runs
on its own CPU (`taskset`); the emulators inherit this process's CPUs (the other one). Redis is
started once by the benchmark (on the load generator's CPU) and passed with `--redis-url`; a
fleet without Redis runs the gateway with `--no-redis` (no prefix affinity).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import CpuProbe
from gateway.bench.procs import Procs
from gateway.bench.readers import metric_values
from gateway.bench.stack import start_stack
from gateway.emulator.profiles import get_profile

API_KEY = "sk-overload"
TIER = "overload"
TTFT_SLO_MS = 500.0
TPOT_SLO_MS = 50.0
PROFILE = "overload"
_COUNTER = re.compile(r"^(vllm:[a-z_]+)\{[^}]*\}\s+([0-9.eE+-]+)$")
_GAUGE = re.compile(r"^(gateway_admission_(?:limit|in_flight))\{[^}]*\}\s+([0-9.eE+-]+)$")


@dataclass(frozen=True)
class FleetSpec:
    """What one fleet runs: replicas, admission on/off (with its settings), the tenant's SLO, replica choice."""

    replicas: int
    admission: bool
    tenant_slo: bool = True
    strategy: str = "predicted_ttft"  # balancing.strategy: predicted_ttft | round_robin
    affinity: bool = True  # Redis (the prefix-affinity store) on
    admission_settings: dict[str, float] = field(default_factory=dict)  # extra `admission:` keys
    seed: int = 1


def routes_text(spec: FleetSpec, urls: Sequence[str]) -> str:
    """The routes file: one tier of `overload` emulators (base URLs `urls`); generous upstream timeouts,
    so that without admission a request waits in the backend queue rather than timing out and failing over."""
    replicas = [(f"{TIER}-{i}", url) for i, url in enumerate(urls)]
    base = routes_yaml({TIER: replicas}).split("\n", 1)[1]  # drop its upstream line: ours follows
    # what an operator writes for vLLM's --max-num-seqs: the gateway then knows a replica is full
    # before its /metrics first shows a queue
    slots = get_profile(PROFILE).max_running
    base = base.replace("    replicas:\n", f"    slots_per_replica: {slots}\n    replicas:\n", 1)
    admission = {"enabled": "true" if spec.admission else "false", **spec.admission_settings}
    return ("upstream: {connect_timeout_s: 2, read_timeout_s: 300, max_attempts: 2}\n" + base
            + "admission: {" + ", ".join(f"{k}: {v}" for k, v in admission.items()) + "}\n"
            + f"balancing: {{strategy: {spec.strategy}}}\n")


def policy_text(spec: FleetSpec) -> str:
    tenant: dict[str, Any] = {"name": "interactive", "key": API_KEY, "priority": "interactive"}
    if spec.tenant_slo:
        tenant["ttft_slo_ms"] = TTFT_SLO_MS
    return policy_yaml(TIER, [tenant], max_tokens=256)


@dataclass
class Fleet:
    """A started fleet: its emulator ports, the gateway's port and process ids."""

    spec: FleetSpec
    emulator_ports: list[int]
    emulator_pids: list[int]
    gateway_port: int
    gateway_pid: int
    redis_pid: int | None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    def pids(self) -> list[int]:
        return [self.gateway_pid, *self.emulator_pids, *([self.redis_pid] if self.redis_pid else [])]

    def cpu(self) -> CpuProbe:
        """CPU seconds of the gateway, the emulators together, Redis, and this process (load generator)."""
        return CpuProbe({"gateway": self.gateway_pid, "loadgen": os.getpid(), "emulators": self.emulator_pids,
                         "redis": self.redis_pid})

    def backend_counters(self) -> dict[str, float]:
        """The emulators' /metrics summed over replicas."""
        total: dict[str, float] = {}
        for port in self.emulator_ports:
            for name, value in metric_values(port, _COUNTER).items():
                total[name] = total.get(name, 0.0) + value
        return total

    def load_sample(self) -> dict[str, float]:
        """Now: the gateway's admission limit and slots held, the backends' running and waiting."""
        backends = self.backend_counters()
        gateway = metric_values(self.gateway_port, _GAUGE)
        return {"limit": gateway.get("gateway_admission_limit", float("nan")),
                "admitted": gateway.get("gateway_admission_in_flight", float("nan")),
                "running": backends.get("vllm:num_requests_running", 0.0),
                "waiting": backends.get("vllm:num_requests_waiting", 0.0)}

    async def wait_idle(self, limit_s: float = 30.0) -> bool:
        """Until no emulator runs or queues a request (cancelled streams take a step to leave)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            c = await asyncio.to_thread(self.backend_counters)
            if c.get("vllm:num_requests_running", 0) + c.get("vllm:num_requests_waiting", 0) == 0:
                return True
            await asyncio.sleep(0.2)
        return False


@contextmanager
def fleet(spec: FleetSpec, tmp: Path, gw_cpu: int | None, redis_url: str | None,
          redis_pid: int | None) -> Iterator[Fleet]:
    """Start `spec`'s emulators and gateway; stop them all on exit (error and Ctrl-C included)."""
    procs = Procs()
    try:
        stack = start_stack(procs, tmp, lambda urls: routes_text(spec, urls), policy_text(spec),
                            emulators=spec.replicas, profile=PROFILE, seed=spec.seed,
                            redis_url=redis_url if spec.affinity else None, gw_cpu=gw_cpu)
        yield Fleet(spec, stack.emulator_ports, stack.emulator_pids, stack.gateway_port, stack.gateway_pid,
                    redis_pid if spec.affinity else None)
        procs.check_alive()
    except BaseException:
        procs.print_tails()
        raise
    finally:
        procs.close()
