"""Instructions the serving gateway executes per request, counted by valgrind (callgrind): a figure a shared,
noisy host does not move, beside req_per_core.py's CPU seconds, which it does (issue 37).

    .venv/bin/python bench/instr_per_request.py [--requests 400] [--repeat 3] [--stream]
    cd OLD_WORKTREE && PYTHONPATH=$PWD /work/main/.venv/bin/python /work/main/bench/instr_per_request.py   # an older tree

req_per_core.py's stack (instant emulator, its Redis, request log on, the same short chat request) with `gateway
serve` run under `valgrind --tool=callgrind`, instrumentation off until it answers and through a warm-up of
--warmup requests. Then --repeat times: instrumentation on (`callgrind_control -i on`) for exactly --requests
requests sent by --concurrency connections, off, and a dump; last, --idle seconds of the gateway alone (its
timers: health probes, gauges), whose rate times each run's seconds is subtracted. Under valgrind a request
takes ~50x its time, so work done per second of the clock (timers, windows that roll) weighs ~50x more per
request than it does serving: the least of the runs is reported, beside each. Prints one JSON object:
instructions per request of the gateway's process only (not Redis, not the emulator). An instruction is not a
microsecond (cache misses and the kernel's share of a socket write are not in it): this ranks changes to the
gateway's own Python on a noisy host; req_per_core.py stays the target's measure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

import gateway.bench.stack as stack
from gateway.bench.per_core import KEY, TIER, chat_body
from gateway.bench.procs import Procs
from gateway.local.redis_server import EmbeddedRedis
from gateway.bench.configs import policy_yaml, routes_yaml

TOTALS = re.compile(rb"^totals:\s+(\d+)", re.M)


async def send(url: str, body: bytes, headers: dict[str, str], count: int, concurrency: int) -> int:
    """POST `body` `count` times over `concurrency` keep-alive connections; how many answered 200."""
    left, ok = count, 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            nonlocal left, ok
            while left > 0:
                left -= 1
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    ok += response.status == 200
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok


def _total(dump: Path) -> int:
    found = TOTALS.search(dump.read_bytes())
    return int(found.group(1)) if found else 0


def callgrind(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3, help="measured runs of --requests: the least is reported")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of the idle gateway counted, subtracted")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--no-replay-fields", action="store_true",
                   help="the gateway's policy says log_replay_fields: false (not for a tree older than it)")
    args = p.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind not found: apt-get install -y valgrind", file=sys.stderr)
        return 2
    procs = Procs()
    tmp = Path(__import__("tempfile").mkdtemp(prefix="bench-instr-"))
    out = tmp / "callgrind.out"
    plain_argv: Callable[..., list[str]] = getattr(stack, "gateway_argv")  # noqa: B009 - any tree's stack

    def under_valgrind(*a: Any) -> list[str]:
        return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                *plain_argv(*a)]

    setattr(stack, "gateway_argv", under_valgrind)  # noqa: B010 - start_stack (an older tree's too) starts the gateway by this name
    try:
        with EmbeddedRedis() as redis:
            policy = policy_yaml(TIER, [{"name": "bench", "key": KEY}], max_tokens=16,
                                 **({"log_replay_fields": False} if args.no_replay_fields else {}))
            started = stack.start_stack(procs, tmp, lambda urls: routes_yaml({TIER: [(f"{TIER}-a", urls[0])]}),
                                        policy, profile="instant", redis_url=redis.url, gateway_timeout_s=900)
            url = f"http://127.0.0.1:{started.gateway_port}/v1/chat/completions"
            body = chat_body(TIER, args.stream, 16)
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
            asyncio.run(send(url, body, headers, args.warmup, args.concurrency))
            runs = []
            for _ in range(args.repeat):
                callgrind(started.gateway_pid, "-i", "on")
                t0 = time.monotonic()
                ok = asyncio.run(send(url, body, headers, args.requests, args.concurrency))
                runs.append((time.monotonic() - t0, ok))
                callgrind(started.gateway_pid, "-i", "off")
                callgrind(started.gateway_pid, "-d")
            callgrind(started.gateway_pid, "-i", "on")  # the gateway alone: its timers' share
            time.sleep(args.idle)
            callgrind(started.gateway_pid, "-i", "off")
            callgrind(started.gateway_pid, "-d")
    finally:
        setattr(stack, "gateway_argv", plain_argv)  # noqa: B010
        procs.close()
    idle_per_s = _total(tmp / f"callgrind.out.{args.repeat + 1}") / args.idle
    per_request = [round((_total(tmp / f"callgrind.out.{i + 1}") - idle_per_s * seconds) / args.requests)
                   for i, (seconds, _) in enumerate(runs)]
    print(json.dumps({"stream": args.stream, "replay_fields": not args.no_replay_fields, "requests": args.requests,
                      "concurrency": args.concurrency,
                      "ok": [ok for _, ok in runs], "seconds": [round(s, 1) for s, _ in runs],
                      "idle_instructions_per_s": round(idle_per_s), "instructions_per_request_runs": per_request,
                      "instructions_per_request": min(per_request), "folder": str(tmp)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
