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
from gateway.local import llama_build, models


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    health_url: str
    command: tuple[str, ...] = ()  # what started it: `gateway up` restarts a child that exits with it
    log_path: Path | None = None


def launch_command(replica: Replica) -> list[str]:
    """The command that serves `replica` locally, from its `launch` block."""
    launch, port = replica.launch, str(replica.port)
    if isinstance(launch, EmulatorLaunch):
        return [sys.executable, "-m", "gateway", "emulate", "--host", "127.0.0.1", "--port", port,
                "--profile", launch.profile, "--seed", str(launch.seed)]
    if isinstance(launch, LlamaCppLaunch):
        return llama_server_command(launch, replica.model, port)
    raise ValueError(f"replica {replica.name} has no launch block")


def llama_server_command(launch: LlamaCppLaunch, alias: str, port: str) -> list[str]:
    """llama.cpp's `llama-server`: `parallel` slots of `n_ctx` tokens each, continuous batching, /metrics."""
    threads = str(launch.n_threads)
    command = [str(llama_build.server_binary()), "--model", str(models.resolve(launch.model)),
               "--host", "127.0.0.1", "--port", port, "--alias", alias,
               "--ctx-size", str(launch.n_ctx * launch.parallel), "--parallel", str(launch.parallel),
               "--no-kv-unified",  # each slot its own n_ctx: a long prompt cannot crowd the others out
               "--threads", threads, "--threads-batch", threads, "--metrics", "--no-webui",
               "--no-jinja", "--chat-template", launch.chat_format]  # the GGUF has no template of its own
    if launch.embedding:
        command += ["--embedding", *(["--pooling", launch.pooling] if launch.pooling else [])]
    return command


def start_child(name: str, command: list[str] | tuple[str, ...], health_url: str, log_path: Path | None) -> Child:
    """One child in its own session (a signal to the gateway's group does not reach it), output to `log_path`."""
    with open(log_path, "ab") if log_path else open(os.devnull, "wb") as output:
        process = subprocess.Popen(list(command), start_new_session=True, stdout=output, stderr=subprocess.STDOUT)
    return Child(name, process, health_url, tuple(command), log_path)


def start_children(routes: RoutesConfig, log_dir: Path | None = None) -> list[Child]:
    """Start every replica with a `launch` block; each one's output goes to LOG_DIR/NAME.log (or is dropped)."""
    children = []
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    for tier in routes.tiers:
        for replica in tier.replicas:
            if replica.launch is None:
                continue
            log_path = log_dir / f"{replica.name}.log" if log_dir else None
            children.append(start_child(replica.name, launch_command(replica), f"{replica.url}/models", log_path))
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
