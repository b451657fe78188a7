"""Proxy overhead of the gateway (issue 2): direct vs bare aiohttp proxy vs gateway, one emulator.

    .venv/bin/python bench/proxy_overhead.py [--quick] [--profile int4] [--strict]

Starts, on 127.0.0.1, one backend emulator (`gateway emulate`), the bare proxy (bench/bare_proxy.py)
and the gateway (`gateway serve`, request log to a temp file), then measures:

1. added TTFT (p50/p99 of proxy path minus the same percentile direct) for streaming chat requests
   at fixed concurrency 1, 32, 128 (closed loop; TTFT = first SSE event with non-empty delta.content);
2. CPU microseconds per non-streaming request in the proxy process (bare vs gateway);
3. CPU microseconds per forwarded SSE chunk: (cpu/req at long output - cpu/req at short output) /
   (content chunks/req long - short), so the per-request cost cancels out.

On a 2-core machine the proxy under test is pinned to one core, the emulator and this load
generator to the other. Results: a table on stdout, JSON + markdown under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvloop

from gateway.bench.overhead import BUSY_WARN_CORES, FULL, QUICK, run_bench
from gateway.bench.procs import Procs, print_tails, stop_on_sigterm
from gateway.bench.report import RESULTS, log, save_results, stamp


def render(result: dict[str, Any]) -> tuple[str, str]:
    """(terminal table, markdown) from the result dict."""
    ttft = {(t["path"], t["concurrency"]): t for t in result["ttft"]}
    cpu, checks = result["cpu"], result["checks"]
    rows: list[list[str]] = []
    for c in result["settings"]["concurrencies"] if ttft else ():
        d = ttft[("direct", c)]
        for name in ("bare", "gateway"):
            t = ttft[(name, c)]
            util = f"{100 * t['proxy_core_util']:.0f}%" if t["proxy_core_util"] is not None else "-"
            lo, hi = t["added_p50_ci95_ms"] or (float("nan"), float("nan"))
            rows.append([f"added TTFT c={c}", name, f"{t['added_p50_ms']:+.3f} ms [{lo:+.2f}, {hi:+.2f}]",
                         f"{t['added_p99_ms']:+.3f} ms",
                         f"direct p50 {d['p50_ms']:.2f} / p99 {d['p99_ms']:.2f} ms; n={t['n']}, "
                         f"err={t['errors']}, {t['rps']:.0f} req/s, proxy core {util}, "
                         f"load core {100 * t['load_core_util']:.0f}%"])
    if cpu:
        b, g, reps = cpu["bare"], cpu["gateway"], result["settings"]["cpu_reps"]
        rows.append(["CPU per request (non-stream)", "bare | gateway", f"{b['cpu_us_per_request']:.0f} us",
                     f"{g['cpu_us_per_request']:.0f} us",
                     f"ratio {checks['cpu_per_request_ratio']['value']:.2f}x; median of {reps}"])
        rows.append(["CPU per SSE chunk", "bare | gateway", f"{b['cpu_us_per_chunk']:.2f} us",
                     f"{g['cpu_us_per_chunk']:.2f} us",
                     f"ratio {checks['cpu_per_chunk_ratio']['value']:.2f}x; median of {reps}"])
        if "bare_h1" in cpu:
            h = cpu["bare_h1"]
            rows.append(["CPU per request, h1 floor", "bare h1 | gateway", f"{h['cpu_us_per_request']:.0f} us",
                         f"{g['cpu_us_per_request']:.0f} us",
                         f"ratio {g['cpu_us_per_request'] / h['cpu_us_per_request']:.2f}x; bare proxy on the "
                         "gateway's upstream client; not a target"])
            rows.append(["CPU per SSE chunk, h1 floor", "bare h1 | gateway", f"{h['cpu_us_per_chunk']:.2f} us",
                         f"{g['cpu_us_per_chunk']:.2f} us",
                         f"ratio {g['cpu_us_per_chunk'] / h['cpu_us_per_chunk']:.2f}x; not a target"])
        if "with_children_cpu_us_per_request" in g:
            rows.append(["CPU incl. child processes (Redis)", "bare | gateway",
                         f"{b['with_children_cpu_us_per_request']:.0f} us/req",
                         f"{g['with_children_cpu_us_per_request']:.0f} us/req",
                         f"per chunk {b['with_children_cpu_us_per_chunk']:.2f} | "
                         f"{g['with_children_cpu_us_per_chunk']:.2f} us; not in the targets"])
    head = ["measure", "path", "p50 [95% CI] / bare", "p99 / gateway", "notes"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join
    term = [line(h.ljust(w) for h, w in zip(head, widths)), line("-" * w for w in widths)]
    term += [line(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    term.append("")
    for name, chk in checks.items():
        note = f"  ({chk['note']})" if chk.get("note") else ""
        verdict = "PASS" if chk["pass"] else "FAIL"
        term.append(f"{verdict}  {name}: {chk['value']:.3f} (target <= {chk['target']}){note}")
    busy = "; ".join(f"{name} phase {w['other_cores']:.2f} cores (+ niced {w.get('niced_cores', 0):.2f}, "
                     f"steal {w['steal_cores']:.2f})" for name, w in result.get("other_work", {}).items())
    warn = ""
    if busy:
        term.append(f"other work on the machine meanwhile: {busy}")
        if any(w["other_cores"] > BUSY_WARN_CORES for w in result["other_work"].values()):
            warn = (f"WARNING: other work used more than {BUSY_WARN_CORES} cores during a phase: "
                    "the numbers above are disturbed; run again on a quiet machine")
            term.append(warn)
    md = ["| measure | path | p50 [95% CI] (or bare) | p99 (or gateway) | notes |", "| --- | --- | --- | --- | --- |"]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    md += ["", "| target | value | limit | result |", "| --- | --- | --- | --- |"]
    md += [f"| {n} | {c['value']:.3f} | <= {c['target']} | {'PASS' if c['pass'] else 'FAIL'}"
           f"{' (' + c['note'] + ')' if c.get('note') else ''} |" for n, c in checks.items()]
    if busy:
        md += ["", f"Other work on the machine meanwhile: {busy}." + (f" **{warn}**" if warn else "")]
    return "\n".join(term), "\n".join(md)


def summarize(files: list[Path]) -> str:
    """One markdown row per result file: the key numbers, to compare runs (`--summarize FILE...`)."""
    rows = ["| run (UTC) | gateway | mode | other work (cores) | added p50 c=32 bare / gateway "
            "| CPU/req bare / gateway | CPU/chunk bare / gateway |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for f in files:
        r = json.loads(f.read_text())
        if r.get("benchmark") != "proxy_overhead":
            continue
        tt = {(t["path"], t["concurrency"]): t for t in r.get("ttft", [])}
        cpu, s = r.get("cpu", {}), r["settings"]
        other = r.get("other_work", {})
        busy = " / ".join(f"{w['other_cores']:.2f}" + (f" (+{w['niced_cores']:.2f} niced)" if w.get("niced_cores")
                                                         else "") for w in other.values()) or "not recorded"
        d32 = tt[("direct", 32)]["p50_ms"] if ("direct", 32) in tt else 0.0
        ttft = (f"{tt[('bare', 32)]['p50_ms'] - d32:+.2f} / {tt[('gateway', 32)]['p50_ms'] - d32:+.2f} ms"
                if ("gateway", 32) in tt else "-")
        req = (f"{cpu['bare']['cpu_us_per_request']:.0f} / {cpu['gateway']['cpu_us_per_request']:.0f} us "
               f"({cpu['gateway']['cpu_us_per_request'] / cpu['bare']['cpu_us_per_request']:.2f}x)" if cpu else "-")
        chunk = (f"{cpu['bare']['cpu_us_per_chunk']:.1f} / {cpu['gateway']['cpu_us_per_chunk']:.1f} us "
                 f"({cpu['gateway']['cpu_us_per_chunk'] / cpu['bare']['cpu_us_per_chunk']:.2f}x)" if cpu else "-")
        mode = f"{s['profile']}, {s['cpu_reps']} reps, {s['ttft_requests'].get('32', '-')} req @32"
        m = r["machine"]
        gw = f"{m['git_commit']}{'+' if m.get('gateway_dirty') else ''}"
        if m.get("gateway_src"):
            gw = f"from {m['gateway_src']}"
        rows.append(f"| {m['date']} | {gw} | {mode} | {busy} | {ttft} | {req} | {chunk} |")
    return "\n".join(rows)


def header_of(result: dict[str, Any]) -> str:
    m = result["machine"]
    mode = result.get("mode") or ("quick" if result["settings"]["cpu_reps"] == 1 else "full") + (
        "" if result.get("ttft") and result.get("cpu") else " (ttft only)" if result.get("ttft") else " (cpu only)")
    gateway = f"gateway from {m['gateway_src']}" if m.get("gateway_src") else f"gateway@{m['git_commit']}"
    return (f"{m['date']}  {m['nproc']} x {m['cpu_model']}  profile={result['settings']['profile']}  "
            f"{mode} run  {result.get('elapsed_s', '?')} s  "
            f"pinned={'yes' if result['pinned'] else 'no'}  {gateway}{' (dirty)' if m['gateway_dirty'] else ''}")


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests, one CPU repetition")
    parser.add_argument("--profile", help="emulator profile (default int4: small but non-zero TTFT/TPOT)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to cores")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target fails")
    parser.add_argument("--only", choices=("ttft", "cpu"), help="run one half of the benchmark")
    parser.add_argument("--py-spy", nargs="?", const="gateway", choices=("gateway", "both"),
                        help="afterwards, profile the gateway (or both proxies) with py-spy; prints top functions")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON/markdown results")
    parser.add_argument("--gateway-src", type=Path, metavar="DIR",
                        help="run the gateway from another checkout (e.g. `git worktree add /tmp/gw-old HEAD~3`), "
                             "for before/after comparisons; the emulator stays this checkout's")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="print the header and markdown tables of an earlier result file, and exit")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                        help="print a markdown table of the key numbers of earlier result files, and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if args.render:
        earlier = json.loads(args.render.read_text())
        print(header_of(earlier) + "\n\n" + render(earlier)[1])
        return 0
    args.stamp = stamp()
    s = QUICK if args.quick else FULL
    if args.profile:
        s = replace(s, profile=args.profile)
    stop_on_sigterm()
    procs = Procs()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmpdir:
            try:
                result = uvloop.run(run_bench(args, s, procs, Path(tmpdir), log))
            except Exception:
                print_tails(Path(tmpdir), ("emulator.out", "bare.out", "gateway.out"))
                raise
            finally:
                procs.close()
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped", file=sys.stderr)
        return 130
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["mode"] = ("quick" if args.quick else "full") + (f" ({args.only} only)" if args.only else "")
    term, md = render(result)
    header = header_of(result)
    print("\n" + header + "\n" + term)
    save_results("proxy_overhead", args.stamp, result, header + "\n\n" + md, args.out)
    failed = [k for k, c in result["checks"].items() if not c["pass"]]
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
