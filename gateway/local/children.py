"""Child processes for local backends: start, wait until healthy, stop (no orphans)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.config import Replica, RoutesConfig
from gateway.config.routes import EmulatorLaunch, LlamaCppLaunch
from gateway.local import models


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    health_url: str


def launch_command(replica: Replica) -> list[str]:
    """The command that serves `replica` locally, from its `launch` block."""
    launch, port = replica.launch, str(replica.port)
    if isinstance(launch, EmulatorLaunch):
        return [sys.executable, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", port,
                "--profile", launch.profile, "--seed", str(launch.seed)]
    if isinstance(launch, LlamaCppLaunch):
        threads = str(launch.n_threads)
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(models.resolve(launch.model)),
                "--host", "127.0.0.1", "--port", port, "--model_alias", replica.model,
                "--chat_format", launch.chat_format, "--n_ctx", str(launch.n_ctx),
                "--n_threads", threads, "--n_threads_batch", threads,
                "--interrupt_requests", "false"]  # else a request arriving cuts the running stream short
    raise ValueError(f"replica {replica.name} has no launch block")


def start_children(routes: RoutesConfig, log_dir: Path | None = None) -> list[Child]:
    """Start every replica with a `launch` block; each one's output goes to LOG_DIR/NAME.log (or is dropped)."""
    children = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    for tier in routes.tiers:
        for replica in tier.replicas:
            if replica.launch is None:
                continue
            command = launch_command(replica)
            with open(log_dir / f"{replica.name}.log", "ab") if log_dir else open(os.devnull, "wb") as output:
                process = subprocess.Popen(command, start_new_session=True, stdout=output, stderr=subprocess.STDOUT)
            children.append(Child(replica.name, process, f"{replica.url}/models"))
    return children


async def wait_healthy(children: list[Child], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for child in children:
            while True:
                if child.process.poll() is not None:
                    raise RuntimeError(f"backend {child.name} exited with code {child.process.returncode}")
                try:
                    async with session.get(child.health_url) as response:
                        if response.status == 200:
                            break
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"backend {child.name} was not healthy after {timeout_s:.0f} s")
                await asyncio.sleep(0.2)


def stop_children(children: list[Child], grace_s: float = 10.0) -> None:
    """SIGTERM each child's process group, then SIGKILL what is left after `grace_s`."""
    for child in children:
        if child.process.poll() is None:
            os.killpg(child.process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(child.process.pid, signal.SIGKILL)
            child.process.wait()
