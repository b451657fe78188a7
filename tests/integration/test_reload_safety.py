"""A `gateway serve` process whose reloads fail, against a real emulator (issue 37): a routes file whose tokenizer
does not load is refused (file, line, field, reason) and hot reload goes on working; SIGHUP, before and after
such a failure, reloads and never kills the process; a policy cut short (a tenant, or a tenant's limit, lost) is
refused until its `removes:` says so; the process still drains and exits 0 on SIGTERM."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from gateway.local.redis_server import free_port
from tests.integration.test_cli import processes, wait_ready
from tests.integration.test_replicas import Replica, spawn, spawn_emulator

__all__ = ["processes"]  # the fixture, imported for use here

KEYS = {"alice": "sk-alice", "bob": "sk-bob"}


def routes(url: str, tokenizer: str = "emulator", price: float = 1.0) -> str:
    return f"""\
tiers:
  - name: t
    precision: int4
    context_window: 4096
    prices: {{input_per_mtok: {price}, output_per_mtok: 2.0}}
    tokenizer: {tokenizer}
    replicas:
      - {{name: t-a, url: "{url}", model: m}}
"""


def policy(bob_max_tokens: str = "\n    max_tokens: {default: 3, maximum: 3}", extra: str = "") -> str:
    tenants = "".join(f"  - name: {name}\n    api_key_sha256: {hashlib.sha256(key.encode()).hexdigest()}"
                      f"{bob_max_tokens if name == 'bob' else ''}\n" for name, key in KEYS.items())
    return f"default_tier: t\nmax_tokens: {{default: 8, maximum: 8}}\ntenants:\n{tenants}{extra}"


async def ask(url: str, key: str) -> tuple[int, int]:
    """(status, completion tokens) of one chat request."""
    body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {key}"}) as response:
            answer = await response.json()
            return response.status, answer.get("usage", {}).get("completion_tokens", -1)


async def wait_for_event(replica: Replica, event: str, after: int, test: Callable[[dict[str, Any]], bool] = bool,
                         timeout_s: float = 15.0) -> dict[str, Any]:
    """The first `event` record past the first `after` records that passes `test`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for record in replica.records()[after:]:
            if record.get("event") == event and test(record):
                return record
        assert replica.process.poll() is None, f"the gateway exited ({replica.process.returncode})"
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {event} record in {timeout_s} s: {[r.get('event') for r in replica.records()[after:]]}")


async def test_failed_reloads_never_stop_reloading_nor_kill_the_gateway(
        tmp_path: Path, processes: list[subprocess.Popen[bytes]]) -> None:
    backend = spawn_emulator(tmp_path, processes, profile="instant")
    routes_file, policy_file = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes_file.write_text(routes(backend))
    policy_file.write_text(policy())
    junk = tmp_path / "tokenizer.json"
    junk.write_text('{"not": "a tokenizer"}')
    port = free_port()
    log = tmp_path / "gateway.log"
    command = ["serve", "--routes", str(routes_file), "--policies", str(policy_file), "--port", str(port),
               "--log-file", str(log), "--no-redis"]
    processes.append(process := spawn(command, tmp_path / "gateway.out"))
    replica = Replica(process, f"http://127.0.0.1:{port}", log)
    wait_ready(f"{replica.url}/readyz", process)
    assert await ask(replica.url, KEYS["bob"]) == (200, 3)

    # a tokenizer file that is there but does not load: refused, named; the last good version serves
    mark = len(replica.records())
    routes_file.write_text(routes(backend, tokenizer=str(junk)))
    refused = await wait_for_event(replica, "config_rejected", mark)
    assert any(f"{routes_file}:6: tiers[0].tokenizer" in issue and "does not load" in issue
               for issue in refused["issues"])
    assert await ask(replica.url, KEYS["bob"]) == (200, 3)

    # SIGHUP after the failure: handled (a reload, refused again), never the default action that kills
    mark = len(replica.records())
    process.send_signal(signal.SIGHUP)
    await wait_for_event(replica, "config_rejected", mark)
    assert process.poll() is None and await ask(replica.url, KEYS["bob"]) == (200, 3)

    # the file watcher still works: a fixed file is taken
    mark = len(replica.records())
    routes_file.write_text(routes(backend, price=1.5))
    await wait_for_event(replica, "config_loaded", mark)

    # a policy cut short: bob's max_tokens line gone (he would get the top level's 8); refused, bob still at 3
    mark = len(replica.records())
    policy_file.write_text(policy(bob_max_tokens=""))
    refused = await wait_for_event(replica, "config_rejected", mark)
    assert any("tenants[bob].max_tokens" in issue and "removes" in issue for issue in refused["issues"])
    assert await ask(replica.url, KEYS["bob"]) == (200, 3)
    # bob gone altogether: refused too
    mark = len(replica.records())
    policy_file.write_text(policy().split("  - name: bob")[0])
    refused = await wait_for_event(replica, "config_rejected", mark)
    assert any("tenants[bob]:" in issue for issue in refused["issues"])
    assert await ask(replica.url, KEYS["bob"]) == (200, 3)
    # said so: taken, by SIGHUP as by the watcher
    mark = len(replica.records())
    policy_file.write_text(policy(bob_max_tokens="", extra="removes:\n  - tenants[bob].max_tokens\n"))
    process.send_signal(signal.SIGHUP)
    await wait_for_event(replica, "config_loaded", mark)
    assert await ask(replica.url, KEYS["bob"]) == (200, 8)

    # and the process still shuts down as it should: drained, exit 0
    process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(process.wait, 15) == 0
    assert "drained" in [r.get("event") for r in replica.records()]

