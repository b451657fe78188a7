"""Requests per second per core (issue 23): the bare proxy, the gateway and LiteLLM, driven by wrk.

    .venv/bin/python bench/req_per_core.py [--quick] [--no-litellm] [--duration S] [--no-docs]
        [--baseline-tree DIR] [--variant-no-replay-fields] [--reps N]

Starts on 127.0.0.1 one backend emulator (`gateway emulate --profile instant`) and in front of it the
bare aiohttp proxy (bench/bare_proxy.py), the gateway (`gateway serve`, one tier at the emulator,
request log on, its Redis server charged to it) and the LiteLLM proxy (.venv-litellm, set up on first
use), each pinned to the last CPU; the emulator and wrk (Debian's package, installed with apt-get
when missing; one thread) share the others. Workloads: a short chat request (16 tokens, `ignore_eos`),
non-streaming and streaming, concurrency 32 for --duration seconds, repetitions interleaved. Per proxy
and workload: req/s, p50/p99 latency (wrk), the proxy tree's CPU seconds (/proc schedstat) and
req/s per core = responses / those CPU seconds. Table to stdout and docs/BENCHMARKS.md (between the
issue-23 markers), JSON + markdown to bench/results/.

Before and after in the same run (issue 37's target): `--baseline-tree DIR` adds the gateway of another checkout
(`git worktree add /tmp/before <commit>`) as the proxy "gateway (<commit>)", and `--variant-no-replay-fields`
this tree's gateway with `log_replay_fields: false`; both on the same emulator and Redis, interleaved with the
others repetition by repetition. Their ratios are printed as a whole and per repetition (each pair ran back to
back: the spread of those is the run's noise). With variants the table does not replace the issue-23 one in
docs/BENCHMARKS.md (--no-docs is implied).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gateway.bench import litellm_env
from gateway.bench.closed_loop import ensure_wrk, wrk_version
from gateway.bench.per_core import WORKLOADS, Settings, Variant, run_rounds, smoke, start_proxies, summarize
from gateway.bench.per_core import ratios as ratios_of
from gateway.bench.procs import begin, interrupted, workdir
from gateway.bench.report import ROOT, command_line, load_line, log, md_table, replace_marked, stamp, write_results
from gateway.local.redis_server import EmbeddedRedis

DOC = ROOT / "docs" / "BENCHMARKS.md"
MARKER = "issue-23-req-per-core"
HEADING = "## Requests per second per core: gateway vs bare proxy vs LiteLLM (issue 23)"
TARGET = 25.0  # gateway / LiteLLM, non-streaming req/s per core
REDIS_NOTE = "; except Redis, moved to the gateway's CPU as `gateway serve`'s own Redis child would be"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one 3 s repetition (numbers for a smoke run only)")
    p.add_argument("--no-litellm", action="store_true")
    p.add_argument("--duration", type=int, help="seconds per measurement (default 10, --quick 3)")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/BENCHMARKS.md")
    p.add_argument("--no-replay-fields", action="store_true",
                   help="the gateway's policy says log_replay_fields: false (not for a tree older than it)")
    p.add_argument("--baseline-tree", type=Path, action="append", default=[],
                   help="another checkout's gateway measured in the same run (a git worktree of an earlier commit)")
    p.add_argument("--variant-no-replay-fields", action="store_true",
                   help="also this tree's gateway with log_replay_fields: false, in the same run")
    p.add_argument("--reps", type=int, help="interleaved repetitions (default 3, --quick 1)")
    return p.parse_args()


def variants(args: argparse.Namespace) -> list[Variant]:
    """The other gateways of the run: each baseline tree (named by its commit), then the no-replay variant."""
    found = []
    for tree in args.baseline_tree:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        found.append(Variant(f"gateway ({commit})", tree.resolve()))
    if args.variant_no_replay_fields:
        found.append(Variant("gateway (no replay fields)", replay_fields=False))
    return found


def settings(args: argparse.Namespace) -> Settings:
    duration, warmup, reps = (3, 1, 1) if args.quick else (10, 2, 3)
    return Settings(concurrency=32, duration_s=args.duration or duration, warmup_s=warmup, reps=args.reps or reps,
                    max_tokens=16)


def render(result: dict[str, Any]) -> str:
    s, m = result["settings"], result["machine"]
    head = (f"`{result['command']}`, {result['date']}, {m['nproc']} x {m['cpu_model']}, git {m['git_commit']}"
            f"{' (dirty)' if m['gateway_dirty'] else ''}; {result['pinning']}. Instant emulator; chat request with "
            f"{s['max_tokens']} output tokens (`ignore_eos`), concurrency {s['concurrency']}, {result['wrk']} "
            f"(one thread); {s['reps']} interleaved repetition(s) x {s['duration_s']} s per proxy and workload "
            f"after {s['warmup_s']} s warm-ups; LiteLLM {result['litellm'] or 'not run'}. {result['load']}.")
    rows = [[r["workload"], r["proxy"], f"{r['rps']:.0f}", f"{r['p50_ms']:.2f} / {r['p99_ms']:.2f}",
             f"{r['proxy_cpu_s']:.2f}", f"**{r['per_core']:.0f}**",
             " / ".join(f"{x:.0f}" for x in r["per_core_reps"]), f"{r['proxy_busy']:.2f}",
             f"{r['load_busy']:.2f} (wrk {r['loadgen_busy']:.2f})", f"{r['other_cores_max']:.2f}", str(r["errors"])]
            for r in result["rows"]]
    header = ["workload", "proxy", "req/s", "p50 / p99 (ms)", "proxy CPU s", "req/s per core", "per rep",
              "proxy cores busy", "emulator + wrk cores busy", "other work (cores, max)", "errors"]
    table = md_table(header, rows, "--- --- ---: ---: ---: ---: ---: ---: ---: ---: ---:")
    lines = [f"- {k}: {v}" for k, v in result["ratios"].items()]
    return head + "\n\n" + table + "\n\n" + "\n".join(lines)


def main() -> int:
    args = parse_args()
    s = settings(args)
    exe = ensure_wrk()
    others = variants(args)
    start = begin(no_pin=False)
    cpu, rest = start.gw_cpu, set(os.sched_getaffinity(0)) if start.gw_cpu is not None else None
    try:
        with EmbeddedRedis() as redis, workdir(start.procs, "bench-per-core-") as tmp:
            assert redis.process is not None
            if cpu is not None:  # as `gateway serve`'s own Redis child: on the gateway's CPU
                os.sched_setaffinity(redis.process.pid, {cpu})
            emulator, proxies = start_proxies(start.procs, tmp, (redis.url, redis.process.pid), cpu,
                                              not args.no_litellm,
                                              **({"replay_fields": False} if args.no_replay_fields else {}),
                                              variants=others)
            tokens = {p.name: {w: smoke(p, stream, s.max_tokens) for w, stream in WORKLOADS.items()} for p in proxies}
            log("smoke test, content tokens per workload: " + "; ".join(f"{k} {v}" for k, v in tokens.items()))
            found = run_rounds(start.procs, exe, proxies, emulator, s, tmp, rest, log)
    except KeyboardInterrupt:
        return interrupted()
    rows = summarize(found)
    result = {"command": command_line(), "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "machine": start.host, "pinning": start.pin_note + REDIS_NOTE * (cpu is not None), "load": load_line(),
              "settings": asdict(s) | {"quick": args.quick},
              "wrk": wrk_version(exe), "litellm": None if args.no_litellm else litellm_env.version(),
              "smoke_tokens": tokens, "rows": rows, "ratios": ratios_of(rows, TARGET), "runs": [m.row() for m in found]}
    text = render(result)
    print("\n" + text)
    print(f"results: {write_results('req_per_core', stamp(), result, text)}")
    if not args.no_docs and not others:
        replace_marked(DOC, MARKER, text, heading=HEADING)
        print(f"updated {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
