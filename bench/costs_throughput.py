"""`gateway costs` throughput and peak memory over a week of rotated logs, at two log sizes.

    .venv/bin/python bench/costs_throughput.py [--sizes 100000,1000000] [--by tenant,tier] [--plot] [--keep]

For each size: write a synthetic week (gateway.accounting.synth: 8 tenants, 3 tiers + rejected,
errors, aborted streams, cache hits, 5% lines without baseline pricing, ~1% other events, one
malformed line in 50,000; days 2-6 gzip'd as logrotate leaves them) into a temp dir, then run the
report in a fresh subprocess and read that process's own peak RSS (os.wait4 -> ru_maxrss). The
target is bounded memory: peak RSS must not grow with the number of lines. Prints a markdown
table and the exact commands.

This script imports only the standard library and generates the logs in a subprocess too: Linux
carries the high-water RSS of the parent at fork over into the child's ru_maxrss, so a parent
that had grown (numpy, generated data) would be measured instead of the report.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATE = "import sys, pathlib; from gateway.accounting.synth import write_logs; " \
    "print(*write_logs(pathlib.Path(sys.argv[1]), int(sys.argv[2])), sep='\\n')"


def run_measured(command: list[str], stdout: Path) -> tuple[float, float]:
    """Run `command`; its wall seconds and its own peak RSS in MiB (Linux reports ru_maxrss in KiB)."""
    start = time.perf_counter()
    with open(stdout, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {shlex.join(command)}\n{stdout.read_text()[-2000:]}")
    return wall, usage.ru_maxrss / 1024


def measure(size: int, by: str, plot: bool, keep: bool) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"costs-{size}-"))
    started = time.perf_counter()
    listing = subprocess.run([sys.executable, "-c", GENERATE, workdir, str(size)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    paths = [Path(line) for line in listing.splitlines()]
    generated = time.perf_counter() - started
    command = [sys.executable, "-m", "gateway.accounting.report", *map(str, paths), "--by", by]
    command += ["--csv", str(workdir / "costs.csv")] + (["--plot", str(workdir / "costs.png")] if plot else [])
    wall, rss = run_measured(command, workdir / "report.txt")
    summary = [line for line in (workdir / "report.txt").read_text().splitlines() if line.startswith(("Lines", "Malf"))]
    disk = sum(p.stat().st_size for p in paths) / 2**20
    if not keep:
        for p in workdir.iterdir():
            p.unlink()
        workdir.rmdir()
    return {"lines": size, "disk_mib": disk, "generate_s": generated, "wall_s": wall, "lines_per_s": size / wall,
            "peak_rss_mib": rss, "command": shlex.join(command), "summary": summary}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated line counts")
    parser.add_argument("--by", default="tenant,tier")
    parser.add_argument("--plot", action="store_true", help="also draw the chart (needs matplotlib)")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs and outputs")
    args = parser.parse_args()
    floor_wall, floor_rss = run_measured([sys.executable, "-c", "import gateway.accounting.report"], Path(os.devnull))
    rows = [measure(int(s), args.by, args.plot, args.keep) for s in args.sizes.split(",")]
    print(f"Command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`")
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()}")
    print(f"Floor (interpreter + imports, no log): peak RSS {floor_rss:.1f} MiB, {floor_wall:.2f} s\n")
    print("| lines | on disk (MiB) | report wall (s) | lines/s | peak RSS (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cells = f"{r['disk_mib']:.1f} | {r['wall_s']:.2f} | {r['lines_per_s']:,.0f} | {r['peak_rss_mib']:.1f}"
        print(f"| {r['lines']:,} | {cells} |")
    for r in rows:
        print(f"\n{r['lines']:,} lines (generated in {r['generate_s']:.1f} s): `{r['command']}`")
        for line in r["summary"]:  # type: ignore[attr-defined]
            print(f"    {line}")


if __name__ == "__main__":
    main()
