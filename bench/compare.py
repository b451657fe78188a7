"""Side by side (issue 9): direct, a bare proxy, the gateway (cache off / on) and LiteLLM, one run.

    make bench-compare                                 # = .venv/bin/python bench/compare.py
    .venv/bin/python bench/compare.py --quick [--no-litellm] [--no-docs]

Starts on 127.0.0.1 one backend emulator (`gateway emulate`), and in front of it: the bare aiohttp
proxy (bench/bare_proxy.py), two gateways (`gateway serve`, classification on: model "auto" is
scored by the ONNX classifier and routed by the bands of policies/local.yaml to one of two tiers,
both served by that emulator; embedded Redis; request log on; the response cache off in one, on in
the other, where requests carry temperature 0 and the cache is warmed first) and the LiteLLM proxy
(its own venv, .venv-litellm, set up here on first use; OpenAI-compatible provider at the same
emulator). Each proxy process is pinned to one CPU, the emulator and this load generator to the
others. Workload: ShareGPT V3 first-turn prompts, `ignore_eos`, a fixed short output (streamed).

1. Added latency at a fixed Poisson load: p50/p99 TTFT and E2E of each path minus direct's, in
   interleaved rounds; CPU µs per request of the proxy's process tree (/proc schedstat).
2. Rate search: the highest Poisson rate at which one proxy process keeps p99 added TTFT and E2E
   (vs direct at the same rate) <= --slo-ms with no errors: doubling, then bisection.
The table goes to docs/BENCHMARKS.md between the issue-9 markers (a rerun replaces it).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.bench.compare import measure, start_paths
from gateway.bench.procs import begin
from gateway.bench.report import ROOT, command_line, load_line, log, md_table, replace_marked, stamp, write_results

DOC = ROOT / "docs" / "BENCHMARKS.md"


def fmt(x: float | None, digits: int = 2, sign: bool = True) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def rate_cell(found: dict[str, Any] | None) -> str:
    if found is None:
        return "not searched"
    if not found["rate"]:
        return "none (over even at 1 req/s)" if not found["capped"] else f"none ({found['capped']})"
    return f"{found['rate']:.0f}" + (f" (≥; {found['capped']})" if found["capped"] else "")


def table(rows: list[dict[str, Any]], search: dict[str, dict[str, Any]], slos: list[float]) -> str:
    header = ["path", "added TTFT p50 / p99 (ms)", "added E2E p50 / p99 (ms)", "CPU µs / request",
              *[f"max req/s, p99 added ≤ {slo:g} ms" for slo in slos], "notes"]
    out = []
    for r in rows:
        cells = ["" if r["path"] == "direct" else rate_cell(search.get(r["path"], {}).get(f"{slo:g}")) for slo in slos]
        out.append([r["path"], f"{fmt(r['added_ttft_p50'])} / {fmt(r['added_ttft_p99'])}",
                    f"{fmt(r['added_e2e_p50'])} / {fmt(r['added_e2e_p99'])}", fmt(r.get("cpu_us"), 0, False),
                    *cells, r["note"]])
    return md_table(header, out)


def render(result: dict[str, Any]) -> str:
    a = result["settings"]
    head = (f"`{result['command']}`, {result['date']}, {result['machine']['nproc']} x "
            f"{result['machine']['cpu_model']}, git {result['machine']['git_commit']}; {result['pinning']}. "
            f"{a['profile']} emulator; {a['specs']} ShareGPT prompts, {a['output_len']} output tokens streamed "
            f"(`ignore_eos`); fixed load {a['rate']:g} req/s Poisson, {a['rounds']} rounds x {a['seconds']:g} s "
            f"per path; rate-search probes {a['probe_s']:g} s. {result['load']}.")
    lines = [f"- {k}: {v}" for k, v in result.get("ratios", {}).items()]
    return head + "\n\n" + table(result["rows"], result["search"], a["slo_ms"]) + "\n\n" + "\n".join(lines)


def ratios(rows: list[dict[str, Any]], search: dict[str, dict[str, Any]], slos: list[float]) -> dict[str, str]:
    """The issue's targets, as measured: gateway vs LiteLLM rate, gateway vs bare added p99."""
    by = {r["path"]: r for r in rows}
    out: dict[str, str] = {}
    ll = next((k for k in search if k.startswith("LiteLLM")), None)
    for slo in slos:
        g, lite = (search.get(k, {}).get(f"{slo:g}") for k in ("gateway", ll or ""))
        if g and lite:
            ratio = f"{g['rate'] / lite['rate']:.1f}x" if lite["rate"] else "LiteLLM sustains no rate"
            out[f"gateway / LiteLLM max rate at p99 added ≤ {slo:g} ms (target ≥ 10x)"] = \
                f"{ratio} ({g['rate']:.0f} vs {lite['rate']:.0f} req/s)"
    if "gateway" in by and "bare proxy" in by:
        g_, b_ = by["gateway"]["added_ttft_p99"], by["bare proxy"]["added_ttft_p99"]
        ratio = f"{g_ / b_:.1f}x" if b_ > 0 else "bare ≤ 0"
        out["gateway / bare proxy added p99 TTFT (target ≤ 2x)"] = f"{ratio} ({g_:+.2f} vs {b_:+.2f} ms)"
    return out


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short phases (numbers for a smoke run only)")
    p.add_argument("--profile", default="int4")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--rate", type=float, default=20.0, help="fixed load for the added-latency phase (req/s)")
    p.add_argument("--slo-ms", type=float, nargs="+", default=[10.0, 50.0],
                   help="p99 added-latency bounds of the rate search (one column each)")
    p.add_argument("--max-rate", type=float, default=1600.0, help="rate search stops here")
    p.add_argument("--no-litellm", action="store_true")
    p.add_argument("--no-search", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--no-docs", action="store_true", help="do not write docs/BENCHMARKS.md")
    args = p.parse_args()
    quick = (4.0, 2, 2.0, 2, 200) if args.quick else (15.0, 4, 6.0, 3, 1000)
    args.seconds, args.rounds, args.probe_s, args.bisect, args.specs = quick
    return args


def main() -> int:
    args = parse_args()
    start = begin(args.no_pin)
    rest = set(os.sched_getaffinity(0)) if start.gw_cpu is not None else None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
            paths = start_paths(args, Path(tmp), start.procs, rest, start.gw_cpu)
            found = asyncio.run(measure(args, paths, log))
    finally:
        start.procs.close()
    settings = {k: v for k, v in vars(args).items()}
    found["ratios"] = ratios(found["rows"], found["search"], args.slo_ms)
    result = {"command": command_line(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": start.host, "pinning": start.pin_note, "load": load_line(), "settings": settings, **found}
    text = render(result)
    print("\n" + text)
    print(f"results: {write_results('compare', stamp(), result, text)}")
    if not args.no_docs:
        replace_marked(DOC, "issue-9-compare", text, heading="## Gateway vs bare proxy vs LiteLLM (issue 9)")
        print(f"updated {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
