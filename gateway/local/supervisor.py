"""`gateway up` keeps its local backends running: a child that exits is logged, announced on the console
and started again after a backoff (1 s, doubling to 30 s; back to 1 s once a child stayed up a minute)."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import structlog

from gateway.local.children import Child, start_child, wait_healthy

log = structlog.get_logger("gateway.up")


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0  # a child that ran this long before exiting starts again at `initial_s`

    def next(self, previous_s: float | None, ran_s: float) -> float:
        if previous_s is None or ran_s >= self.stable_s:
            return self.initial_s
        return min(self.max_s, previous_s * 2)


@dataclass
class Supervisor:
    """Watches `children` (replaced in place on restart, so whoever stops them stops the live ones)."""

    children: list[Child]
    backoff: Backoff = Backoff()
    poll_s: float = 0.5
    health_timeout_s: float = 120.0
    console: TextIO = field(default_factory=lambda: sys.stderr)
    restarts: int = 0
    _started: dict[str, float] = field(default_factory=dict)
    _delays: dict[str, float] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop` is set: restart each child that exits, one restart at a time per child."""
        now = time.monotonic()
        for child in self.children:
            self._started.setdefault(child.name, now)
        restarting: dict[int, asyncio.Task[None]] = {}
        try:
            while not stop.is_set():
                for index, child in enumerate(self.children):
                    if index not in restarting and child.process.poll() is not None:
                        restarting[index] = asyncio.create_task(self._restart(index, stop))
                for index in [i for i, task in restarting.items() if task.done()]:
                    restarting.pop(index)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
                except TimeoutError:
                    pass
        finally:
            for task in restarting.values():
                task.cancel()
            await asyncio.gather(*restarting.values(), return_exceptions=True)

    async def _restart(self, index: int, stop: asyncio.Event) -> None:
        child = self.children[index]
        code = child.process.returncode
        ran_s = time.monotonic() - self._started.get(child.name, time.monotonic())
        delay = self._delays[child.name] = self.backoff.next(self._delays.get(child.name), ran_s)
        where = f" (its log: {child.log_path})" if child.log_path else ""
        log.warning("backend_exited", backend=child.name, code=code, ran_s=round(ran_s, 1), restart_in_s=delay)
        self._say(f"backend {child.name} exited with code {code} after {ran_s:.0f} s; restarting in {delay:.0f} s"
                  f"{where}")
        try:
            await asyncio.wait_for(stop.wait(), timeout=delay)
            return  # shutting down: no restart
        except TimeoutError:
            pass
        if not child.command:
            self._say(f"backend {child.name}: no command to restart it with")
            return
        fresh = start_child(child.name, child.command, child.health_url, child.log_path)
        self.children[index] = fresh
        self._started[child.name] = time.monotonic()
        self.restarts += 1
        log.warning("backend_restarted", backend=child.name, pid=fresh.process.pid, restart=self.restarts)
        self._say(f"backend {child.name} restarted (pid {fresh.process.pid})")
        try:
            await wait_healthy([fresh], self.health_timeout_s)
        except RuntimeError as err:  # it exited again, or never answered: the next poll sees the exit
            self._say(f"backend {child.name} is not healthy: {err}")
            return
        log.info("backend_healthy", backend=child.name)
        self._say(f"backend {child.name} is healthy again")

    def _say(self, line: str) -> None:
        print(f"gateway up: {line}", file=self.console, flush=True)
