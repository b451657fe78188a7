"""Overload benchmark (issue 7): admission control and prefix-aware replica choice against emulators.

    .venv/bin/python bench/overload.py [--quick] [--capacity RATE] [--admission KEY=VALUE ...]

On 127.0.0.1: `overload` emulators (2 replicas; 4 for the multi-turn replay), one gateway on generated
routes/policy files (one tier; tenant `interactive`, priority interactive, TTFT SLO 500 ms), an
embedded Redis, and the load generator in this process. The gateway is pinned to one CPU; the
emulators, Redis and this process to the other(s).

1. Capacity C: admission off and no SLO in the policy; Poisson ShareGPT first turns (prompts
   <= 1024 tokens, max_tokens = the reference answer's length capped at 256, ignore_eos) at rising
   rates; C = the highest rate with p99 TTFT <= 500 ms, p99 TPOT <= 50 ms and nothing failed.
2. 0.5C, 1C, 2C, 3C, admission on and off: p50/p99 TTFT and TPOT of answered requests, share
   shed, goodput (requests meeting both SLOs / arrival window), CPU cores used by each process.
3. Multi-turn ShareGPT conversations on 4 replicas: predicted-TTFT choice with Redis prefix
   affinity vs round-robin without Redis (round_robin alone keeps affinity): backend prefix-cache
   hit rate and TTFT.

Every point runs on a fresh fleet. Results: JSON under bench/results/, a table on stdout; a full run
also writes docs/overload*.png and the overload section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from gateway.bench.overload.report import render, write_docs
from gateway.bench.overload.run import run
from gateway.bench.procs import begin
from gateway.bench.report import command_line, stamp, write_results
from gateway.local.redis_server import EmbeddedRedis


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--quick", action="store_true", help="short durations (a smoke run); docs are not written")
    p.add_argument("--capacity", type=float, metavar="RATE", help="skip the search: C = RATE req/s")
    p.add_argument("--start-rate", type=float, default=1.0, help="first rate of the capacity search (req/s)")
    p.add_argument("--admission", action="append", default=[], metavar="KEY=VALUE",
                   help="an `admission:` setting of the routes file for the admission-on runs (e.g. "
                        "ttft_target_ms=300); default: initial_limit and max_limit = the fleet's batch slots")
    p.add_argument("--gateway-defaults", action="store_true",
                   help="admission-on runs with the gateway's default admission settings only")
    p.add_argument("--conversations", type=int, help="multi-turn replay: conversations (default 40, quick 12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    p.add_argument("--skip", choices=("sweep", "multiturn"), action="append", default=[], help="leave a part out")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    start = begin(args.no_pin)
    when = stamp()
    try:
        with tempfile.TemporaryDirectory(prefix="overload-") as tmp, EmbeddedRedis() as store:
            result = uvloop.run(run(args, start, Path(tmp), store))
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped", file=sys.stderr)
        return 130
    finally:
        start.procs.close()
    result.update(command=command_line(), machine=start.host, pinning=start.pin_note, mode=
                  "quick" if args.quick else "full", load_start=start.load_start, load_end=os.getloadavg(),
                  elapsed_s=round(time.monotonic() - start.started, 1))
    terminal, markdown = render(result)
    print("\n" + terminal)
    print(f"wrote {write_results('overload', when, result, markdown)}")
    if not args.quick and not args.skip:
        for path in write_docs(result, markdown):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
