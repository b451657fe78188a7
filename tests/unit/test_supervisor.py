"""`gateway up` supervises its children: an exit is logged and announced, the child restarted with backoff."""

import asyncio
import io
import os
import signal
import sys

from structlog.testing import capture_logs

from gateway.config import Replica
from gateway.local.children import launch_command, start_child, stop_children, wait_healthy
from gateway.local.redis_server import free_port
from gateway.local.supervisor import Backoff, Supervisor

FAST = Backoff(initial_s=0.05, max_s=0.2, stable_s=60.0)


def test_the_backoff_doubles_to_its_cap_and_starts_over_after_a_stable_run() -> None:
    delays, previous = [], None
    for _ in range(5):
        previous = FAST.next(previous, ran_s=0.1)
        delays.append(previous)
    assert delays == [0.05, 0.1, 0.2, 0.2, 0.2]
    assert FAST.next(0.2, ran_s=60.0) == 0.05  # it stayed up a minute: the next crash is a fresh one


async def test_a_child_that_keeps_exiting_is_restarted_with_growing_delays_and_said_so() -> None:
    command = (sys.executable, "-c", "import sys; sys.exit(3)")
    children = [start_child("crashy", command, "http://127.0.0.1:9/v1/models", None)]
    console = io.StringIO()
    supervisor = Supervisor(children, FAST, poll_s=0.02, health_timeout_s=5.0, console=console)
    stop = asyncio.Event()
    with capture_logs() as logs:
        task = asyncio.create_task(supervisor.run(stop))
        while supervisor.restarts < 3:
            await asyncio.sleep(0.02)
        stop.set()
        await task
    stop_children(children)
    exits = [e for e in logs if e["event"] == "backend_exited"]
    assert [e["code"] for e in exits[:3]] == [3, 3, 3]
    assert [e["restart_in_s"] for e in exits[:3]] == [0.05, 0.1, 0.2]
    text = console.getvalue()
    assert "gateway up: backend crashy exited with code 3" in text and "restarting in" in text
    assert text.count("restarted (pid") == 3
    assert children[0].command == command  # replaced in place by the live process


async def test_no_restart_once_stopping() -> None:
    children = [start_child("gone", (sys.executable, "-c", "pass"), "http://127.0.0.1:9/v1/models", None)]
    children[0].process.wait()
    supervisor = Supervisor(children, Backoff(initial_s=5.0), poll_s=0.02, console=io.StringIO())
    stop = asyncio.Event()
    task = asyncio.create_task(supervisor.run(stop))
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, timeout=2.0)
    assert supervisor.restarts == 0


async def test_a_killed_backend_comes_back_healthy() -> None:
    """A real child (the emulator on loopback) killed with SIGKILL: restarted, answering again."""
    replica = Replica.model_validate({"name": "emu-a", "url": f"http://127.0.0.1:{free_port()}/v1", "model": "m",
                                      "launch": {"kind": "emulator", "profile": "instant"}})
    children = [start_child(replica.name, launch_command(replica), f"{replica.url}/models", None)]
    console = io.StringIO()
    supervisor = Supervisor(children, FAST, poll_s=0.05, console=console)
    stop = asyncio.Event()
    try:
        await wait_healthy(children, timeout_s=60)
        task = asyncio.create_task(supervisor.run(stop))
        first = children[0].process.pid
        os.killpg(first, signal.SIGKILL)
        for _ in range(600):
            if "is healthy again" in console.getvalue():
                break
            await asyncio.sleep(0.1)
        assert children[0].process.pid != first and children[0].process.poll() is None
        assert f"backend emu-a exited with code {-signal.SIGKILL}" in console.getvalue()
        await wait_healthy(children, timeout_s=5)
        stop.set()
        await task
    finally:
        stop_children(children)
