"""A compiled closed-loop load generator, wrk (C, one epoll thread), for throughput per core
(bench/req_per_core.py, issue 23): an aiohttp load generator spends per request about what the
aiohttp bare proxy it drives does, so on a 2-core machine it would share the ceiling with the proxy.

    exe = ensure_wrk()                                    # Debian's `wrk`, apt-get installed when missing
    spec = LoadSpec(url, body, {"Content-Type": "application/json"}, concurrency=32, duration_s=10)
    m = measure(procs, exe, spec, folder, "wrk-chat-gateway", proxy="gateway", workload="chat",
                proxy_pid=gw_pid, emulator_pid=emu_pid, cpus={0})
    m.run.rps, m.run.p99_ms, m.per_core                  # req/s, latency, requests / proxy CPU second

wrk sends the POST body and headers from a Lua script (`wrk_script`), whose `done` hook prints one
line `wrk-result {json}`: responses, duration, socket and status errors, latency percentiles in µs.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.bench.cpu import CpuProbe, Pids, machine_cpu_seconds, tree_cpu_seconds
from gateway.bench.procs import Procs

PACKAGE = "wrk"  # Debian bookworm: wrk 4.1.0 (hey is packaged too; wrk costs less CPU per request)
MARK = "wrk-result "
ERRORS = ("connect", "read", "write", "status", "timeout")

DONE_HOOK = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('%s{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\\n',
    "{mark}", summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
"""


def ensure_wrk(install: bool = True) -> str:
    """wrk's path; when missing, `apt-get install -y wrk` (after `apt-get update`; sudo unless root)."""
    found = shutil.which(PACKAGE)
    if found or not install:
        if not found:
            raise RuntimeError(f"{PACKAGE} not found on PATH: apt-get install -y {PACKAGE} (or `make loadgen`)")
        return found
    apt = ["apt-get"] if os.geteuid() == 0 else ["sudo", "apt-get"]
    print(f"{PACKAGE} not found: {' '.join(apt)} install -y {PACKAGE}", flush=True)
    subprocess.run([*apt, "update", "-qq"], check=True)
    subprocess.run([*apt, "install", "-y", "-qq", PACKAGE], check=True, stdout=subprocess.DEVNULL)
    return ensure_wrk(install=False)


def wrk_version(exe: str) -> str:
    """`wrk debian/4.1.0-3+b2 [epoll]` (wrk -v prints it, then a copyright, and exits 1)."""
    out = subprocess.run([exe, "-v"], capture_output=True, text=True)
    text = out.stdout or out.stderr
    return text.splitlines()[0].split(" Copyright")[0].strip() if text else "unknown"


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What wrk sends: `body` POSTed to `url` with `headers` by `concurrency` connections for
    `duration_s` (whole seconds: wrk reads no fractions), one thread."""

    url: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 32
    duration_s: int = 10
    timeout_s: int = 10
    threads: int = 1


def lua_string(text: str) -> str:
    """`text` as a double-quoted Lua string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{escaped}"'


def wrk_script(body: bytes, headers: Mapping[str, str]) -> str:
    """The Lua script: method POST, the body and headers, and the `done` hook printing `wrk-result {json}`."""
    lines = ['wrk.method = "POST"', f"wrk.body = {lua_string(body.decode())}"]
    lines += [f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n" + DONE_HOOK.replace("{mark}", MARK)


def wrk_argv(exe: str, spec: LoadSpec, script: Path) -> list[str]:
    if spec.concurrency < spec.threads:
        raise ValueError("wrk needs at least one connection per thread")
    return [exe, "-t", str(spec.threads), "-c", str(spec.concurrency), "-d", f"{spec.duration_s}s",
            "--timeout", f"{spec.timeout_s}s", "-s", str(script), spec.url]


@dataclass(frozen=True, slots=True)
class WrkResult:
    """One wrk run: `requests` responses read (any status; non-2xx/3xx counted again in `errors["status"]`)."""

    requests: int
    duration_s: float
    bytes: int
    errors: dict[str, int]
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float

    @property
    def ok(self) -> int:
        """Responses with a 2xx/3xx status."""
        return self.requests - self.errors["status"]

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def rps(self) -> float:
        return self.ok / self.duration_s if self.duration_s else 0.0


def parse_output(text: str) -> WrkResult:
    """The `wrk-result` line of wrk's output; ValueError (with the output's tail) without one."""
    line = next((ln for ln in text.splitlines() if ln.startswith(MARK)), None)
    if line is None:
        raise ValueError(f"no {MARK.strip()} line in wrk's output:\n{text[-1500:]}")
    d = json.loads(line[len(MARK):])
    return WrkResult(d["requests"], d["duration_us"] / 1e6, d["bytes"], {k: int(d[k]) for k in ERRORS},
                     d["p50_us"] / 1e3, d["p90_us"] / 1e3, d["p99_us"] / 1e3, d["max_us"] / 1e3, d["mean_us"] / 1e3)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One run against one proxy: wrk's numbers and the CPU seconds each side used meanwhile."""

    proxy: str
    workload: str
    run: WrkResult
    proxy_cpu_s: float  # the proxy's process tree (schedstat)
    emulator_cpu_s: float
    loadgen_cpu_s: float  # wrk (its rusage once reaped)
    other_cores: float  # the rest of the machine's busy CPU over the run, in cores

    @property
    def per_core(self) -> float:
        """Successful requests per CPU second of the proxy: req/s on one fully busy core."""
        return self.run.ok / self.proxy_cpu_s if self.proxy_cpu_s > 0 else 0.0

    @property
    def proxy_busy(self) -> float:
        """The proxy's cores busy over the run (1.0: its pinned CPU saturated)."""
        return self.proxy_cpu_s / self.run.duration_s if self.run.duration_s else 0.0

    @property
    def load_busy(self) -> float:
        """Emulator + wrk cores busy over the run (both share one CPU: near 1.0, they were the ceiling)."""
        return (self.emulator_cpu_s + self.loadgen_cpu_s) / self.run.duration_s if self.run.duration_s else 0.0

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "rps": self.run.rps, "per_core": self.per_core, "proxy_busy": self.proxy_busy,
                "load_busy": self.load_busy}


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measure(procs: Procs, exe: str, spec: LoadSpec, folder: Path, name: str, *, proxy: str, workload: str,
            proxy_pid: Pids, emulator_pid: int, cpus: set[int] | None) -> Measurement:
    """Run wrk once (on `cpus`, output to `folder`/NAME.out) and charge the CPU each side used meanwhile
    (`proxy_pid`: the process trees charged to the proxy)."""
    script = folder / f"{name}.lua"
    script.write_text(wrk_script(spec.body, spec.headers))
    out = folder / f"{name}.out"
    probe = CpuProbe({"proxy": proxy_pid, "emulator": emulator_pid}, tree_cpu_seconds)
    loadgen0, (busy0, _, _), t0 = _children_cpu_s(), machine_cpu_seconds(), time.monotonic()
    with probe.measure() as used:
        proc = procs.start(name, wrk_argv(exe, spec, script), cpus, out)
        code = proc.wait(timeout=spec.duration_s + spec.timeout_s + 30)
    loadgen, wall = _children_cpu_s() - loadgen0, time.monotonic() - t0
    procs.items.remove((name, proc))  # done: not one of the processes `check_alive` and the tails are about
    procs.logs.remove(out)
    text = out.read_text(errors="replace")
    if code != 0:
        raise RuntimeError(f"wrk exited with code {code}:\n{text[-1500:]}")
    run = parse_output(text)
    other = (machine_cpu_seconds()[0] - busy0 - used["proxy"] - used["emulator"] - loadgen) / wall
    return Measurement(proxy, workload, run, used["proxy"], used["emulator"], loadgen, max(0.0, other))
