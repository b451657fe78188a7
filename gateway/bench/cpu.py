"""CPU time of processes, to charge a stretch of load to each: CPU per request, cores busy, other work.

`cpu_seconds` reads a process's threads' on-CPU time from /proc/PID/task/*/schedstat (nanoseconds;
psutil's 10 ms ticks as the fallback). A `CpuProbe` names groups of processes and measures what each
group used over a `with` block:

    probe = CpuProbe({"gateway": gw_pid, "load": [emu_pid, os.getpid()]})
    with probe.measure() as used:
        run = await closed_loop(...)
    per_request_us(used["gateway"], len(run.results))
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import psutil

CpuReader = Callable[[int], float]  # pid -> CPU seconds so far
Pids = int | Sequence[int] | None  # one process, several (summed), or none (0 seconds)
Log = Callable[[str], None]


def cpu_seconds(pid: int) -> float:
    """CPU time of the process in seconds, to the nanosecond: the sum of its threads' on-CPU time from
    /proc/PID/task/*/schedstat (user + system). Falls back to psutil's utime + stime (10 ms ticks)."""
    total, found = 0, False
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(Path(task.path, "schedstat").read_bytes().split()[0])
                found = True
    if found:
        return total / 1e9
    return tick_cpu_seconds(pid)


def tick_cpu_seconds(pid: int) -> float:
    """utime + stime from /proc/PID/stat (includes exited threads; 10 ms resolution): a cross-check."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of the process and its live children (the gateway's embedded Redis server)."""
    total = cpu_seconds(pid)
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += cpu_seconds(child.pid)
    return total


def per_request_us(cpu_s: float, requests: int) -> float:
    """CPU microseconds per request; NaN for no requests."""
    return cpu_s / requests * 1e6 if requests else math.nan


class CpuProbe:
    """CPU seconds of named groups of processes, read with `read` (default `cpu_seconds`)."""

    def __init__(self, groups: Mapping[str, Pids], read: CpuReader = cpu_seconds) -> None:
        self.groups = {name: _pids(pids) for name, pids in groups.items()}
        self.read = read

    def now(self) -> dict[str, float]:
        """Each group's CPU seconds so far."""
        return {name: sum((self.read(pid) for pid in pids), 0.0) for name, pids in self.groups.items()}

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        """Yields a dict filled on exit with the CPU seconds each group used inside the block."""
        used: dict[str, float] = {}
        before = self.now()
        yield used
        after = self.now()
        used.update({name: after[name] - before[name] for name in after})


def _pids(pids: Pids) -> tuple[int, ...]:
    if pids is None:
        return ()
    return (pids,) if isinstance(pids, int) else tuple(pids)


def machine_cpu_seconds() -> tuple[float, float, float]:
    """(busy at normal priority, busy niced, steal) CPU seconds of the whole machine since boot."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (v[0] + v[2] + v[5] + v[6]) / hz, v[1] / hz, v[7] / hz


class OtherWork:
    """How busy the machine was with work other than this benchmark's processes, phase by phase:
    the numbers on a shared machine mean little without it."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.probe = CpuProbe({"bench": pids}, tree_cpu_seconds)
        self.phases: dict[str, dict[str, float]] = {}

    def _now(self) -> tuple[float, float, float, float, float]:
        busy, niced, steal = machine_cpu_seconds()
        return time.perf_counter(), busy, niced, steal, self.probe.now()["bench"]

    @contextlib.contextmanager
    def phase(self, name: str, log: Log) -> Iterator[None]:
        t0, b0, n0, s0, o0 = self._now()
        yield
        t1, b1, n1, s1, o1 = self._now()
        wall = t1 - t0
        found = {"wall_s": wall, "other_cores": max(0.0, (b1 - b0) - (o1 - o0)) / wall,
                 "niced_cores": (n1 - n0) / wall, "steal_cores": (s1 - s0) / wall, "bench_cores": (o1 - o0) / wall}
        self.phases[name] = found
        log(f"  [{name}: other work on the machine {found['other_cores']:.2f} cores busy (+ niced "
            f"{found['niced_cores']:.2f}), steal {found['steal_cores']:.2f}, this benchmark "
            f"{found['bench_cores']:.2f} cores]")
