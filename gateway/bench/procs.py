"""The processes a benchmark starts on 127.0.0.1: emulators, gateways, proxies; CPU pinning; start-up.

`Procs` starts each child in its own session, dying with the benchmark (PR_SET_PDEATHSIG), on the
CPUs it is given, and ends each by its own handle. `begin` is what every load benchmark does first:
SIGTERM behaves as Ctrl-C, the machine is recorded, the gateway gets a CPU of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.bench.report import ROOT, log, machine
from gateway.local.redis_server import free_port, free_ports

__all__ = ["Pinning", "Procs", "RunStart", "bare_proxy_argv", "begin", "emulator_argv", "free_port", "free_ports",
           "gateway_argv", "interrupted", "pinning", "print_tails", "stop_on_sigterm", "wait_gateway", "wait_http", "workdir"]

PR_SET_PDEATHSIG = 1
Popen = subprocess.Popen[bytes]


def _child_setup(cpus: set[int] | None) -> Callable[[], None]:
    def setup() -> None:
        with contextlib.suppress(Exception):  # die with the benchmark, even on SIGKILL
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


class Procs:
    """The processes this benchmark started; `close` ends each of them by its own handle."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Popen]] = []
        self.logs: list[Path] = []

    def start(self, name: str, argv: Sequence[str], cpus: set[int] | None, log: Path, cwd: Path = ROOT) -> Popen:
        """Start `argv` on `cpus` (None: this process's), stdout and stderr to the file `log`."""
        with log.open("wb") as out:
            proc = subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_child_setup(cpus), start_new_session=True)
        self.items.append((name, proc))
        self.logs.append(log)
        return proc

    def print_tails(self, lines: int = 20) -> None:
        """After a failure: the last lines each child wrote, to stderr."""
        for log in dict.fromkeys(self.logs):
            print_tails(log.parent, [log.name], lines)

    def by_name(self) -> dict[str, Popen]:
        return dict(self.items)

    def check_alive(self) -> None:
        for name, proc in self.items:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}")

    def close(self) -> None:
        for _, proc in self.items:
            if proc.poll() is None:
                proc.terminate()
        for _, proc in self.items:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.items.clear()
        self.logs.clear()


@contextlib.contextmanager
def workdir(procs: Procs, prefix: str) -> Iterator[Path]:
    """A temporary folder for a run's files and logs; on an error the children's last lines are printed;
    on the way out (error and Ctrl-C included) every child is stopped."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        try:
            yield Path(tmp)
        except Exception:
            procs.print_tails()
            raise
        finally:
            procs.close()


def interrupted() -> int:
    """What a benchmark says and returns when Ctrl-C (or SIGTERM) stopped it."""
    print("interrupted; all benchmark processes stopped", file=sys.stderr)
    return 130


def wait_http(url: str, proc: Popen, name: str, method: str = "GET", timeout_s: float = 30) -> None:
    """Until `url` answers HTTP (any status); raises when `proc` exits first or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} during start-up")
        try:
            req = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None)
            with urllib.request.urlopen(req, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers HTTP: up
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not answer {url} within {timeout_s}s")


def wait_gateway(port: int, proc: Popen, timeout_s: float = 60) -> None:
    wait_http(f"http://127.0.0.1:{port}/healthz", proc, "gateway", timeout_s=timeout_s)


def print_tails(folder: Path, names: Sequence[str], lines: int = 20) -> None:
    """After a failure: the last lines each child process wrote, to stderr."""
    for name in names:
        f = folder / name
        if f.exists() and f.stat().st_size:
            print(f"--- {name} (last lines) ---\n" + "\n".join(f.read_text().splitlines()[-lines:]), file=sys.stderr)


def gateway_argv(routes: Path, policies: Path, port: int, log_file: Path, redis_url: str | None,
                 cpu: int | None) -> list[str]:
    """`gateway serve` on 127.0.0.1 (pinned with taskset to `cpu`, which execs: the pid stays the gateway's)."""
    argv = [sys.executable, "-m", "gateway", "serve", "--routes", str(routes), "--policies", str(policies),
            "--host", "127.0.0.1", "--port", str(port), "--log-file", str(log_file)]
    argv += ["--redis-url", redis_url] if redis_url else ["--no-redis"]
    return (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv


def emulator_argv(port: int, profile: str = "instant", seed: int = 1) -> list[str]:
    return [sys.executable, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", str(port),
            "--profile", profile, "--seed", str(seed)]


def bare_proxy_argv(port: int, upstream: str, client: str = "aiohttp") -> list[str]:
    """bench/bare_proxy.py, the floor of proxy overhead, in front of `upstream` (a base URL); `client`: the
    upstream client it forwards with (aiohttp's, or the gateway's own `h1`)."""
    return [sys.executable, str(ROOT / "bench" / "bare_proxy.py"), "--port", str(port), "--upstream", upstream,
            "--client", client]


@dataclass(frozen=True, slots=True)
class Pinning:
    """`rest`: the CPUs of this process and of every child not pinned otherwise; `proxy`: the CPU of the
    process under test (the gateway) alone; `note`: a sentence saying so. None, None when off."""

    rest: set[int] | None
    proxy: int | None
    note: str


def pinning(no_pin: bool) -> Pinning:
    """With two or more CPUs allowed: the process under test gets the last one alone, the rest get the
    others (this process moves there now: children started from now on inherit it)."""
    allowed = sorted(os.sched_getaffinity(0))
    if no_pin or len(allowed) < 2:
        why = "--no-pin" if no_pin else f"only {len(allowed)} CPU allowed"
        return Pinning(None, None, f"pinning OFF ({why})")
    gw, rest = allowed[-1], set(allowed[:-1])
    os.sched_setaffinity(0, rest)
    return Pinning(rest, gw, f"gateway pinned with `taskset -c {gw}` to CPU {gw}; load generator, emulator and "
                             f"Redis on CPU {','.join(map(str, sorted(rest)))}")


@dataclass
class RunStart:
    """What every load benchmark records as it starts (and the process group it starts things in)."""

    started: float
    load_start: tuple[float, float, float]
    host: dict[str, Any]
    gw_cpu: int | None
    pin_note: str
    procs: Procs = field(default_factory=Procs)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """SIGTERM behaves as Ctrl-C: KeyboardInterrupt, so that the `finally` blocks stop the children."""
    signal.signal(signal.SIGTERM, _interrupt)


def begin(no_pin: bool, say: Callable[[str], None] | None = log) -> RunStart:
    """SIGTERM behaves as Ctrl-C (children are stopped); machine facts; the gateway's CPU pinning."""
    stop_on_sigterm()
    started, load_start, host = time.monotonic(), os.getloadavg(), machine()
    pin = pinning(no_pin)
    if say is not None:
        say(pin.note)
    return RunStart(started, load_start, host, pin.proxy, pin.note)
