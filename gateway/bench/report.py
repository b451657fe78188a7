"""Terminal output of a benchmark: a progress bar, the result table, and latency-vs-load plots."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from gateway.bench.client import RequestResult
from gateway.bench.summary import Summary

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


def plot_latency_vs_load(points: Sequence[tuple[float, Summary]], path: Path, title: str = "") -> Path:
    """TTFT, TPOT and E2E latency (p50 solid, p99 dashed) against offered load (req/s), one PNG.
    Needs matplotlib (the `train` extra); imported here, not at module load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
