"""`gateway whatif` over 100,000 and 1,000,000 synthetic log lines: time and peak RSS (issue 40).

    .venv/bin/python bench/whatif_throughput.py [--sizes 100000,1000000] [--keep DIR]

For each size: a synthetic week of rotated logs (`gateway.accounting.synth`, with the replay fields added by
`gateway.whatif.synth`: 8 tenants, 3 tiers, refusals, errors, aborted streams, cache hits, ~1 % other events,
malformed lines) is written in a subprocess, then `gateway whatif` replays it under a baseline and a candidate
(the same routes, other bands) in a fresh subprocess pinned to one core, whose own peak RSS is read
(os.wait4 -> ru_maxrss). Prints the decisions' seconds (the whatif's own `meta.seconds.decisions`), the whole
run's wall seconds and the peak RSS, as a markdown table, with the exact commands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATE = ("import sys, pathlib; from gateway.whatif.synth import write_replayable, write_config; "
            "d = pathlib.Path(sys.argv[1]); print(*write_replayable(d, int(sys.argv[2])), *write_config(d), sep='\\n')")
CANDIDATE_BANDS = ("routing: {bands: [{below: 0.55, tier: small-int4}, {below: 0.85, tier: medium-int8}, "
                   "{tier: large-fp16}]}", "routing: {bands: [{below: 0.7, tier: small-int4}, {tier: medium-int8}]}")


def measured(command: list[str]) -> tuple[float, float, str]:
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"failed: {shlex.join(command)}\n{out.decode()}")
    return time.perf_counter() - start, usage.ru_maxrss / 1024, out.decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--keep", type=Path, default=None, help="write the logs here and keep them")
    args = parser.parse_args()
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        folder = Path(tempfile.mkdtemp(prefix=f"whatif-{size}-", dir=args.keep))
        made = subprocess.run([sys.executable, "-c", GENERATE, str(folder), str(size)], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout.split()
        logs, routes, policy = made[:-2], made[-2], made[-1]
        candidate = folder / "candidate.yaml"
        candidate.write_text(Path(policy).read_text().replace(*CANDIDATE_BANDS))
        out = folder / "whatif.json"
        command = ["taskset", "-c", "0", sys.executable, "-m", "gateway", "whatif", "--log", *logs,
                   "--routes", routes, "--policies", str(candidate), "--baseline-routes", routes,
                   "--baseline-policies", policy, "--json", str(out), "--html", str(folder / "whatif.html")]
        wall, rss, _ = measured(command)
        meta = json.loads(out.read_text())["meta"]
        rows.append((size, meta["requests"], meta["seconds"]["decisions"], wall, rss, meta["window"]["simulated"]))
        print(f"$ {shlex.join(command)}", file=sys.stderr)
    print("| log lines | requests replayed | decisions + prices (2 scenarios) s | whole run s | peak RSS MiB "
          "| window requests simulated |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for size, requests, decided, wall, rss, window in rows:
        print(f"| {size:,} | {requests:,} | {decided:.1f} | {wall:.1f} | {rss:.0f} | {window:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
