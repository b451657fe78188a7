"""What a benchmark reports: a progress bar, the result table, latency-vs-load plots, markdown tables,
the machine and command it ran on, result files under bench/results/ and its section of a doc."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from gateway.bench.client import RequestResult
from gateway.bench.summary import Summary

ROOT = Path(__file__).resolve().parents[2]  # the checkout: bench/, docs/, policies/
RESULTS = ROOT / "bench" / "results"
WIDTH = 50
METRIC_TITLES = (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                 ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency"))


class ProgressBar:
    """`[#####.....] 120/400 done, 3 failed, 12.1 s` on one line of `stream`, redrawn at most 10 times
    a second when `stream` is a terminal; `total` 0 when unknown (duration-bound runs show the elapsed time instead)."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, label: str = "") -> None:
        self.total, self.stream, self.label = total, stream, label
        self.done = self.failed = 0
        self.t0 = self.drawn = time.monotonic()
        self.tty = stream.isatty()  # not a terminal (a log file): one line at the end only

    def __call__(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += not result.ok
        now = time.monotonic()
        if self.tty and (now - self.drawn >= 0.1 or self.done == self.total):
            self.drawn = now
            self.draw(now)

    def draw(self, now: float) -> None:
        filled = int(WIDTH * self.done / self.total) if self.total else 0
        bar = "#" * filled + "." * (WIDTH - filled)
        of = f"/{self.total}" if self.total else ""
        self.stream.write(f"\r{self.label}[{bar}] {self.done}{of} done, {self.failed} failed, {now - self.t0:.1f} s")
        self.stream.flush()

    def close(self) -> None:
        self.draw(time.monotonic())
        self.stream.write("\n")
        self.stream.flush()


def _row(name: str, value: float | int | str) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{name:<40}{text:<10}"


def format_table(s: Summary, title: str = "Serving Benchmark Result") -> str:
    """The summary as `vllm bench serve` prints it."""
    lines = [f"{title:=^50}", _row("Successful requests:", s["completed"]), _row("Failed requests:", s["failed"]),
             _row("Benchmark duration (s):", float(s["duration"])),
             _row("Total input tokens:", s["total_input_tokens"]),
             _row("Total generated tokens:", s["total_output_tokens"]),
             _row("Request throughput (req/s):", float(s["request_throughput"]))]
    if "request_goodput" in s:
        lines.append(_row("Request goodput (req/s):", float(s["request_goodput"])))
    lines += [_row("Output token throughput (tok/s):", float(s["output_throughput"])),
              _row("Total token throughput (tok/s):", float(s["total_token_throughput"]))]
    for key, title_ in METRIC_TITLES:
        lines.append(f"{title_:-^50}")
        lines.append(_row(f"Mean {key.upper()} (ms):", float(s[f"mean_{key}_ms"])))
        lines.append(_row(f"Median {key.upper()} (ms):", float(s[f"median_{key}_ms"])))
        shown = [k for k in s if k.startswith("p") and k.endswith(f"_{key}_ms") and k != f"p50_{key}_ms"]
        for name in sorted(shown, key=lambda k: float(k[1:].split("_")[0])):
            lines.append(_row(f"P{name[1:].split('_')[0]} {key.upper()} (ms):", float(s[name])))
    if s.get("errors"):
        lines.append(f"{'Errors':-^50}")
        lines += [f"{n:>6}  {e}" for e, n in s["errors"].items()]
    lines.append("=" * 50)
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib.pyplot drawing to files (Agg), imported on first use: matplotlib is the `train` extra."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_vs_load(points: Sequence[tuple[float, Summary]], path: Path, title: str = "") -> Path:
    """TTFT, TPOT and E2E latency (p50 solid, p99 dashed) against offered load (req/s), one PNG.
    Needs matplotlib (the `train` extra); imported here, not at module load."""
    plt = pyplot()
    xs = [x for x, _ in points]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=80)
    for ax, (key, name) in zip(axes, (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E latency"))):
        for q, style in (("median", "-o"), ("p99", "--o")):
            ys = [s[f"{q}_{key}_ms"] for _, s in points]
            ax.plot(xs, [y if y is not None and math.isfinite(y) else math.nan for y in ys], style,
                    label=q.replace("median", "p50"))
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def replace_marked(path: Path, name: str, body: str, heading: str = "") -> None:
    """Put `body` between `<!-- begin NAME -->` and `<!-- end NAME -->` in the markdown file at `path`,
    replacing what was there; without the markers, append `heading` and the marked block."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + (heading.strip() + "\n\n" if heading else "") + block + "\n"
    path.write_text(text)


def log(message: str) -> None:
    """A progress line on stdout, at once (the output may be a pipe)."""
    print(message, flush=True)


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A markdown table; `align`: one rule per column separated by spaces (e.g. "--- ---:")."""
    rule = align.split() if align else ["---"] * len(header)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def command_line() -> str:
    """How this run was started, as a reader would type it from the checkout."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


def load_line(label: str = "machine load") -> str:
    one, five, fifteen = os.getloadavg()
    return f"{label} (os.getloadavg 1/5/15 min): {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """The machine, the software and the gateway code (git commit, uncommitted changes) a run measures."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "gateway", "policies"], cwd=ROOT,
                           capture_output=True, text=True)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "nproc": os.cpu_count(),
        "cpu_model": cpu_model(), "python": platform.python_version(), "aiohttp": aiohttp.__version__,
        "uvloop": importlib.metadata.version("uvloop"), "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
        "git_commit": commit.stdout.strip() or None, "gateway_dirty": bool(dirty.stdout.strip()),
        "gateway_uncommitted": dirty.stdout.split("\n")[:20],
    }


def run_title(name: str, host: dict[str, Any], quick: bool, elapsed_s: float) -> str:
    """`NAME DATE  N x CPU  gateway@COMMIT (dirty)  quick|full run, S s`: a load benchmark's first line."""
    return (f"{name} {host['date']}  {host['nproc']} x {host['cpu_model']}  gateway@{host['git_commit']}"
            f"{' (dirty)' if host['gateway_dirty'] else ''}  {'quick' if quick else 'full'} run, {elapsed_s} s")


def load_sentence(start: Sequence[float], end: Sequence[float], nproc: int) -> str:
    return (f"Load average (1/5/15 min) at start {start[0]:.2f}/{start[1]:.2f}/{start[2]:.2f}, at end "
            f"{end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f} on {nproc} CPUs.")


def other_cores(phases: dict[str, dict[str, float]]) -> str:
    """`phase cores, ...`: the other work on the machine per phase (cpu.OtherWork.phases)."""
    return ", ".join(f"{k} {v['other_cores']:.2f}" for k, v in phases.items())


def stamp() -> str:
    """The local time as result files are named: 20260101-120000."""
    return dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def write_results(name: str, when: str, result: Any, markdown: str, folder: Path = RESULTS) -> Path:
    """`folder`/NAME-WHEN.json (the result) and .md (the markdown); returns the JSON's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{when}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    (folder / f"{name}-{when}.md").write_text(markdown + "\n")
    return path


def save_results(name: str, when: str, result: Any, markdown: str, folder: Path = RESULTS) -> Path:
    """`write_results`, then where they went on stdout (`results: PATH (+ .md)`)."""
    path = write_results(name, when, result, markdown, folder)
    print(f"\nresults: {shown(path)} (+ .md)")
    return path


def shown(path: Path) -> Path:
    """`path` relative to the checkout when it is inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
