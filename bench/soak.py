"""Soak: hours-long behaviour in minutes. Half of measured capacity against emulators, sampled per minute.

    .venv/bin/python bench/soak.py [--minutes 20] [--profile int4] [--no-pin]

Starts on 127.0.0.1 a Redis this script controls, two backend emulators (one tier, two replicas)
and the gateway (`gateway serve --redis-url ...`, pinned to its own CPU unless --no-pin). Then:

1. capacity: closed loops of streaming chat requests at rising concurrency (8 s each) until the
   throughput stops growing by 5 %; capacity is the best requests/s seen;
2. soak: an open loop (Poisson arrivals) at half that rate for --minutes minutes, streaming chat,
   one in five requests deterministic (temperature 0 over 50 prompts: cache hits and stores);
3. every minute: the gateway's RSS and open file descriptors (psutil), requests, errors, and p50 /
   p99 TTFT as the client saw it (first content byte).

Verdict (issue 11): RSS growth from the first to the last minute < 5 %, no file-descriptor growth,
p99 TTFT of the last minute within 1.5x of the first. Prints the table; writes
bench/results/soak-<stamp>.json and .md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from gateway.bench.procs import begin, interrupted
from gateway.bench.report import command_line, load_line, log, md_table, stamp, write_results
from gateway.bench.soak import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--profile", default="int4", help="emulator profile (int4 | int8 | fp16 | instant)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    args = parser.parse_args()
    start = begin(args.no_pin)
    when = stamp()
    try:
        result = run(args, start, log)
    except KeyboardInterrupt:
        return interrupted()
    result.update(command=command_line(), machine=start.host, pinning=start.pin_note,
                  load_start=start.load_start, load_end=os.getloadavg(),
                  wall_s=round(time.monotonic() - start.started, 1))
    table = md_table(list(result["minutes"][0]), [list(r.values()) for r in result["minutes"]])
    v = result["verdict"]
    summary = (f"RSS growth {v['rss_growth_pct']} % ({'ok' if v['rss_ok'] else 'FAIL'} < 5 %), "
               f"fd growth {v['fd_growth']} ({'ok' if v['fds_ok'] else 'FAIL'}), "
               f"p99 TTFT last/first {v['p99_ratio']} ({'ok' if v['p99_ok'] else 'FAIL'} <= 1.5), "
               f"{v['errors']} errors")
    markdown = "\n\n".join([f"`{result['command']}`", table, summary, load_line()])
    print(markdown)
    print(f"wrote {write_results('soak', when, result, markdown)}")
    return 0 if v["rss_ok"] and v["fds_ok"] and v["p99_ok"] and not v["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
