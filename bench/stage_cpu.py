"""Where a request's CPU goes in the serving gateway, stage by stage (issue 37): microseconds per request.

    .venv/bin/python bench/stage_cpu.py [--duration S] [--stream] [--no-replay-fields]
    cd OLD_WORKTREE && PYTHONPATH=$PWD /work/main/.venv/bin/python /work/main/bench/stage_cpu.py   # an older tree

req_per_core.py's stack (instant emulator, `gateway serve` pinned alone to the last CPU, its Redis, request log on)
with bench/stage_cpu_hook/ on the gateway's PYTHONPATH: the hook times each stage of the request path, the
finish (log line and finishers) and, where the tree has them, the replay fields and the line's rendering, in the
serving process. wrk (one thread, 32 connections) sends req_per_core's short chat request for --duration seconds;
the gateway's CPU seconds per request come from /proc as in req_per_core. Stages that wait on I/O (proxy: the
upstream answer; admission, cache: Redis when used) include the wait; the others are CPU. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gateway.bench.closed_loop import LoadSpec, ensure_wrk, measure
from gateway.bench.per_core import chat_body, start_proxies
from gateway.bench.procs import begin, workdir
from gateway.local.redis_server import EmbeddedRedis

HOOK = Path(__file__).resolve().parent / "stage_cpu_hook"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--no-replay-fields", action="store_true",
                   help="the gateway's policy says log_replay_fields: false (not for a tree older than it)")
    args = p.parse_args()
    start = begin(no_pin=False)
    cpu = start.gw_cpu
    rest = set(os.sched_getaffinity(0)) - {cpu} if cpu is not None else None
    with EmbeddedRedis() as redis, workdir(start.procs, "bench-stage-cpu-") as tmp:
        assert redis.process is not None
        times = tmp / "stages.jsonl"
        os.environ["GATEWAY_STAGE_TIMES"] = str(times)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])])
        if cpu is not None:
            os.sched_setaffinity(redis.process.pid, {cpu})
        emulator, proxies = start_proxies(start.procs, tmp, (redis.url, redis.process.pid), cpu, False,
                                          replay_fields=not args.no_replay_fields)
        gateway = next(proxy for proxy in proxies if proxy.name == "gateway")
        spec = LoadSpec(gateway.url, chat_body(gateway.model, args.stream, 16), gateway.headers, 32, args.duration)
        measure(start.procs, ensure_wrk(), LoadSpec(gateway.url, spec.body, spec.headers, 32, 2), tmp, "warmup",
                proxy="gateway", workload="chat", proxy_pid=gateway.pids, emulator_pid=emulator, cpus=rest)
        found = measure(start.procs, ensure_wrk(), spec, tmp, "run", proxy="gateway", workload="chat",
                        proxy_pid=gateway.pids, emulator_pid=emulator, cpus=rest)
        start.procs.close()  # SIGTERM: the gateway drains and its hook writes at exit
        stages = json.loads(times.read_text().splitlines()[-1]) if times.exists() else {}
    print(json.dumps({"stream": args.stream, "requests": found.run.ok, "gateway_busy": round(found.proxy_busy, 2),
                      "gateway_cpu_us_per_request": round(1e6 / found.per_core, 1) if found.per_core else None,
                      "hook": stages}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
