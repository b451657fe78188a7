"""Graceful shutdown: SIGTERM closes the listener, /readyz says draining, streams in flight finish
up to `--drain-timeout`, past it they are cut and still logged, then the process exits 0."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.app import create_app
from gateway.server import LIFECYCLE
from gateway.testing import gateway_config, tier
from tests.conftest import StartApp, StartEmulator
from tests.integration.test_replicas import (STREAM_TOKENS, Replica, cluster_config, processes, refuses_connections,
                                             spawn_emulator, start_gateways, stream_text)

__all__ = ["processes"]  # the fixture, imported for use here


async def test_readyz_turns_503_while_draining(start_emulator: StartEmulator, start_app: StartApp) -> None:
    backend = await start_emulator()
    app = create_app(gateway_config([tier("t", [f"{backend.url}/v1"])]))
    url = await start_app(app)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/readyz") as response:
            assert (response.status, (await response.json())["status"]) == (200, "ready")
        app[LIFECYCLE].draining = True
        async with session.get(f"{url}/readyz") as response:
            assert (response.status, (await response.json())["status"]) == (503, "draining")


def one_gateway(folder: Path, started: list[subprocess.Popen[bytes]], drain_timeout_s: float) -> Replica:
    """A `gateway serve` process (no Redis) in front of one slow emulated backend (int8: ~2.5 s streams, past the
    1 s drain deadline of the test that cuts one)."""
    backend = spawn_emulator(folder, started, profile="int8")
    (replica,) = start_gateways(folder, started, cluster_config([backend]), 1, "--no-redis",
                                "--drain-timeout", str(drain_timeout_s))
    return replica


async def sigterm_mid_stream(replica: Replica) -> tuple[asyncio.Task[tuple[str, str | None]], float]:
    """Start a long stream, SIGTERM the gateway at its first chunk; the stream's task and the signal's time."""
    first_chunk = asyncio.Event()
    stream = asyncio.create_task(stream_text(replica, "tell me a long story", first_chunk))
    await asyncio.wait_for(first_chunk.wait(), timeout=20)
    replica.process.send_signal(signal.SIGTERM)
    return stream, time.monotonic()


def events(replica: Replica) -> list[str]:
    return [r["event"] for r in replica.records() if r.get("event") in ("draining", "drain_deadline", "drained")]


async def test_sigterm_lets_the_stream_finish_and_refuses_new_connections(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    replica = one_gateway(tmp_path, processes, drain_timeout_s=10)
    stream, signalled = await sigterm_mid_stream(replica)
    for _ in range(100):
        if refuses_connections(replica.url) or stream.done():
            break
        await asyncio.sleep(0.02)
    assert refuses_connections(replica.url) and not stream.done()  # refused while the stream still runs
    text, finish = await stream
    assert text and finish == "length"
    assert await asyncio.to_thread(replica.process.wait, 15) == 0
    assert time.monotonic() - signalled < 10  # it left as soon as the stream was done, not at the deadline
    (request,) = replica.requests()
    assert (request["outcome"], request["completion_tokens"]) == ("ok", STREAM_TOKENS)
    assert events(replica) == ["draining", "drained"]
    assert [r["in_flight"] for r in replica.records() if r.get("event") == "draining"] == [1]


async def test_past_the_drain_deadline_the_stream_is_cut_and_logged(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    replica = one_gateway(tmp_path, processes, drain_timeout_s=1)
    stream, signalled = await sigterm_mid_stream(replica)
    with pytest.raises(openai.APIError):
        await stream
    assert await asyncio.to_thread(replica.process.wait, 15) == 0
    assert 1 <= time.monotonic() - signalled < 5
    (request,) = replica.requests()
    assert request["status"] == 499 and 0 < request["completion_tokens"] < STREAM_TOKENS
    assert events(replica) == ["draining", "drain_deadline", "drained"]
    assert [r["cancelled"] for r in replica.records() if r.get("event") == "drain_deadline"] == [1]
