"""py-spy for a benchmark: record a process while load runs, and summarize the collapsed stacks by
function (self and inclusive share of the samples) and by package."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any


def executable() -> str | None:
    """py-spy beside this Python (the venv's), else on PATH."""
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


async def record(exe: str, pid: int, raw: Path, limit_s: float, load: Callable[[], Awaitable[object]]) -> str:
    """Record `pid` with py-spy (1 kHz, with native frames, raw collapsed stacks to `raw`) while `load()`
    runs; py-spy gives up after `limit_s` + 10 s. Returns what py-spy wrote to stderr."""
    spy = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "1000", "--format", "raw", "--native",
                            "--output", str(raw), "--duration", str(int(limit_s) + 10)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        await asyncio.sleep(1.0)  # let it attach
        await load()
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=15)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.wait(timeout=5)
    return err.decode(errors="replace")


def _where(frame: str) -> str:
    return frame.partition(" (")[2].removesuffix(")")


def _frame_key(frame: str) -> str:
    """'serve (gateway/http.py:49)' -> 'serve (gateway/http.py)'."""
    name, where = frame.partition(" (")[0], _where(frame)
    return f"{name} ({where.split(':', 1)[0]})" if where else name


def _area(frame: str) -> str:
    """The package a leaf frame belongs to; native frames (py-spy --native) by library."""
    where = _where(frame).split(":", 1)[0]
    if where.startswith("libc.so") or where.startswith("libpthread"):
        return "libc (syscalls: read/write/epoll...)"
    if where.startswith("libpython") or where.endswith((".c", ".h")) or ".so" in where:
        return "C (CPython, uvloop, extensions)"
    if where.startswith(("<", "_weakrefset", "enum", "typing", "functools", "contextlib", "dataclasses")):
        return "python stdlib/generated"
    return where.split("/", 1)[0] or "other"


# With --native, py-spy counts threads blocked in these calls as active: sleeping helper threads
# (watchfiles' notify thread, idle executor workers), not CPU. Their samples are dropped.
BLOCKED = ("clock_nanosleep", "pthread_cond_timedwait", "pthread_cond_wait", "PyThread_acquire_lock_timed",
           "Condition.wait", "sem_timedwait", "sem_wait")


def summarize_pyspy(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self and inclusive sample shares per function, and self share per package, from py-spy's
    collapsed-stack output (idle samples excluded, so samples are proportional to CPU time)."""
    self_: dict[str, int] = {}
    incl: dict[str, int] = {}
    areas: dict[str, int] = {}
    total = blocked = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        if any(b in stack for b in BLOCKED):
            blocked += n
            continue
        total += n
        leaf = frames[-1]
        self_[_frame_key(leaf)] = self_.get(_frame_key(leaf), 0) + n
        areas[_area(leaf)] = areas.get(_area(leaf), 0) + n
        for key in {_frame_key(f) for f in frames}:
            incl[key] = incl.get(key, 0) + n

    def share(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])]

    # the gateway's own functions, without the entry point frames that hold every sample
    inclusive = [(k, v) for k, v in share(incl) if "(gateway/" in k and v < 99][:top]
    return {"samples": total, "blocked_samples_dropped": blocked, "self_pct": share(self_)[:top],
            "inclusive_pct": inclusive,
            "self_pct_by_package": share(areas)}
