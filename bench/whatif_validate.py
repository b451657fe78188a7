"""`gateway whatif` against real runs on the emulator fleet (issue 40): replayed against its own policy, and
changed policies predicted then run for real on the same traffic.

    .venv/bin/python bench/whatif_validate.py [--requests 1200] [--rate 10] [--limit 300] [--out /tmp/whatif-validate]
    .venv/bin/python bench/whatif_validate.py --stack local --requests 240 --rate 1 --limit 30 --max-out 64 \
        --interleave 50 --out /tmp/whatif-local3   # make run's llama.cpp tiers (routes/local.yaml): policies A and B

Separate processes, as in production: five `gateway emulate` processes (small 2 x int4, medium 1 x int8, large
1 x fp16, and an int8 replica for the tier scenario C adds: the emulator's A100 physics in real time), one gateway
process per run (`gateway serve`'s app and request log, with the difficulty scorer a table: each prompt's score is
fixed, as a classifier's would be; no Redis: local limits, no response cache), and this process as the load
generator. Each run gets fresh emulators (the same prompts again would find the last run's prefix cache warm, which
the replay of log A cannot know). With two or more CPUs the gateway gets the last one alone (`taskset`), emulators
and load generator share the others. Every emulator runs the same seed, so a prompt's answer length is the same on
every tier (the replay assumes the logged length on another tier; with a seed per replica, lengths differ at random
between runs).

A bounded open-loop load (Poisson arrivals at --rate, 70 % streamed, max_tokens lognormal up to 512) is sent once
per run with the same prompts at the same offsets, each run starting at the same second of a UTC minute (the rate
limit's windows are clock minutes: the same traffic meets them at the same phase):

  run A   policy A: bands 0.5 / 0.8 on small, medium, large; no rate limit             -> log A
  run B   policy B: other bands (0.3 / 0.6) and a tighter limit (--limit requests a minute)  -> log B
  run C   routes C: a tier added (mid, int8, priced between small and medium), bands 0.4 / 0.6 / 0.8  -> log C

On the llama.cpp tiers (--stack local) the machine's speed moves minute to minute with other tenants' work on its
shared cores, which no log shows: A then B (the default there) confounds that with the policy change.
`--interleave S` runs A and B on one set of servers (started once, not restarted between blocks) in S-second blocks
of the workload, A then B each time, each block to its own policy's gateway at PHASE_S into a fresh minute once
the last block's answers are all in: both logs see the same external conditions to within a minute.

Then `gateway whatif --log A --calibrate` against policy A (the replay against what log A recorded), and policies
B and C predicted from log A, each compared with what its run's log recorded. Writes compare.json and prints the
markdown tables (docs/BENCHMARKS.md's whatif section).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml

from gateway.bench.procs import Procs, emulator_argv, free_port, pinning, stop_on_sigterm, wait_gateway, wait_http
from gateway.bench.report import ROOT, command_line, load_line
from gateway.whatif.cli import run_whatif
from gateway.whatif.decide import HITS
from gateway.whatif.records import LogStats, read_logged

API_KEY = "sk-whatif-validate"
#        name, emulator profile, replicas, price in / out per M tokens
TIERS = (("small", "int4", 2, (0.05, 0.2)), ("mid", "int8", 1, (0.1, 0.4)), ("medium", "int8", 1, (0.15, 0.6)),
         ("large", "fp16", 1, (0.5, 2.0)))
SEED = 7  # every emulator's: a prompt's answer length is the same on every tier
PHASE_S = 5.0  # each run starts this many seconds into a UTC minute


def routes(urls: dict[str, list[str]], names: tuple[str, ...]) -> dict[str, Any]:
    return {"balancing": {"health_interval_s": 0.0, "scrape_interval_s": 0.0},
            "tiers": [{"name": name, "precision": profile, "context_window": 32768,
                       "prices": {"input_per_mtok": price[0], "output_per_mtok": price[1]},
                       "replicas": [{"name": f"{name}-{i}", "url": url, "model": "emulated",
                                     "launch": {"kind": "emulator", "profile": profile}}
                                    for i, url in enumerate(urls[name])]}
                      for name, profile, _, price in TIERS if name in names]}


def policy(bands: list[tuple[float | None, str]], rate: int | None) -> dict[str, Any]:
    tenant: dict[str, Any] = {"name": "bench", "api_key_sha256": hashlib.sha256(API_KEY.encode()).hexdigest()}
    if rate is not None:
        tenant["rate_limit"] = {"requests_per_min": rate}
    return {"default_tier": "small", "max_tokens": {"default": 128, "maximum": 1024},
            "routing": {"bands": [{"tier": tier} if below is None else {"below": below, "tier": tier}
                                  for below, tier in bands]},
            "tenants": [tenant]}


SCENARIOS: dict[str, tuple[tuple[str, ...], list[tuple[float | None, str]], bool, str]] = {
    "A": (("small", "medium", "large"), [(0.5, "small"), (0.8, "medium"), (None, "large")], False,
          "the log's own policy: bands 0.5 / 0.8"),
    "B": (("small", "medium", "large"), [(0.3, "small"), (0.6, "medium"), (None, "large")], True,
          "other bands (0.3 / 0.6) and a tighter limit"),
    "C": (("small", "mid", "medium", "large"), [(0.4, "small"), (0.6, "mid"), (0.8, "medium"), (None, "large")],
          False, "a tier added (mid: int8 at 0.10 / 0.40 $/M), bands 0.4 / 0.6 / 0.8"),
}


def workload(count: int, rate: float, seed: int = 40, words_mu: float = 4.5,
             max_out: int = 512) -> list[tuple[float, str, float, int, bool]]:
    """(offset s, prompt, difficulty, max_tokens, stream) per request: Poisson arrivals, lognormal prompt lengths
    (median e^words_mu words) and max_tokens (median ~100, at most max_out), 70 % streamed."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for i in range(count):
        at += rng.expovariate(rate)
        words = " ".join(f"w{rng.randrange(5000)}" for _ in range(int(rng.lognormvariate(words_mu, 0.8))))
        out.append((at, f"request {i}: {words}", rng.random(),
                    int(min(max_out - 1, rng.lognormvariate(4.6, 0.7))) + 1, rng.random() < 0.7))
    return out


# --- make run's llama.cpp tiers (--stack local): routes/local.yaml's chat tiers on free ports ---

LOCAL_SCENARIOS: dict[str, tuple[tuple[str, ...], list[tuple[float | None, str]], bool, str]] = {
    "A": (("small-q4", "large-f16"), [(0.6, "small-q4"), (None, "large-f16")], False,
          "the log's own policy: band 0.6"),
    "B": (("small-q4", "large-f16"), [(0.3, "small-q4"), (None, "large-f16")], True,
          "another band (0.3) and a tighter limit"),
}


def local_routes(folder: Path) -> Path:
    """routes/local.yaml with its chat tiers only (no embedder), each replica on a free port."""
    routes = yaml.safe_load((ROOT / "routes" / "local.yaml").read_text())
    routes["tiers"] = [t for t in routes["tiers"] if t.get("replicas")]
    for tier in routes["tiers"]:
        for replica in tier["replicas"]:
            replica["url"] = f"http://127.0.0.1:{free_port()}/v1"
    path = folder / "routes-local.yaml"
    path.write_text(yaml.safe_dump(routes))
    return path


def main_local(args: argparse.Namespace) -> int:
    """The same comparison on make run's llama.cpp tiers (llama-server children): sequential runs on fresh
    backends each, or (`--interleave S`) both policies' gateways on one set of backends, block by block."""
    from gateway.config.loader import load_routes
    from gateway.local.children import start_children, stop_children, wait_healthy

    stop_on_sigterm()
    folder: Path = args.out
    folder.mkdir(parents=True, exist_ok=True)
    load = workload(args.requests, args.rate, seed=args.seed, words_mu=2.5, max_out=args.max_out)
    table = folder / "difficulty.json"
    table.write_text(json.dumps({prompt: difficulty for _, prompt, difficulty, _, _ in load} | (
        {prompt: difficulty for name in LOCAL_SCENARIOS for _, prompt, difficulty, _, _ in tagged(load, name)}
        if args.interleave else {})))
    routes_file = local_routes(folder)
    load_before = os.getloadavg()
    statuses: dict[str, dict[str, int]] = {}
    procs = Procs()
    try:
        for name, (_, bands, limited, _) in LOCAL_SCENARIOS.items():
            (folder / f"routes-{name}.yaml").write_text(routes_file.read_text())
            pol = policy(bands, args.limit if limited else None)
            pol["default_tier"] = "small-q4"
            pol["max_tokens"] = {"default": 64, "maximum": args.max_out}
            (folder / f"policy-{name}.yaml").write_text(yaml.safe_dump(pol))
        if args.interleave:
            children = start_children(load_routes(routes_file), folder / "llama")
            try:
                asyncio.run(wait_healthy(children, timeout_s=300))
                statuses = interleaved(procs, folder, table, load, args.interleave)
            finally:
                procs.close()
                stop_children(children)
        for name in LOCAL_SCENARIOS if not args.interleave else ():
            children = start_children(load_routes(routes_file), folder / f"llama-{name}")
            try:
                asyncio.run(wait_healthy(children, timeout_s=300))
                print(f"run {name} ({args.requests} requests at {args.rate}/s) ...", file=sys.stderr)
                _, statuses[name] = run(procs, folder, name, folder / f"routes-{name}.yaml",
                                        folder / f"policy-{name}.yaml", table, load, None)
            finally:
                procs.close()
                stop_children(children)
            print(f"run {name}: statuses {statuses[name]}; {load_line()}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    meta = {"command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "pinning": "no pinning (llama-server threads, gateway and load generator share the CPUs)",
            "load_before": load_before, "load_after": os.getloadavg(), "statuses": statuses, "stack": "local",
            "interleave_s": args.interleave}
    (folder / "runs.json").write_text(json.dumps(meta, indent=1))
    print(markdown(analyse(folder, meta)))
    return 0


def blocks(load: list[Any], block_s: float) -> list[list[Any]]:
    """The workload cut into `block_s`-second blocks of its offsets, each block's offsets from its own start."""
    out: list[list[Any]] = []
    for at, *rest in load:
        k = int(at // block_s)
        while len(out) <= k:
            out.append([])
        out[k].append((at - k * block_s, *rest))
    return [block for block in out if block]


def tagged(load: list[Any], name: str) -> list[Any]:
    """`load` with each prompt led by the policy's name (`A request 12: ...`): the same number of tokens for every
    policy, and no prompt of one policy's run a prefix of the other's. Interleaved, both policies' gateways send
    the same workload to the same llama-server children, which keep every prompt they prefilled (llama.cpp's
    prompt cache): untagged, each of B's requests that reached the replica A's had found 92-94 % of its prompt
    cached (about half of B's answers on pairs 5 and 7, docs/BENCHMARKS.md), which the replay of log A cannot
    know (it prefills a moved request whole) and which no candidate would find in production."""
    return [(at, f"{name} {prompt}", *rest) for at, prompt, *rest in load]


def interleaved(procs: Procs, folder: Path, table: Path, load: list[Any], block_s: float) -> dict[str, dict[str, int]]:
    """Runs A and B interleaved on the same llama.cpp servers (started once): the workload in `block_s`-second
    blocks, each block sent to A's gateway then to B's, each send starting at PHASE_S into a UTC minute once the
    last one's answers are all in (so a block under PHASE_S + block_s <= 60 meets one rate-limit minute, in the run
    and in the replay alike). Always A then B, never B then A on alternate blocks: the limiter's sliding window
    weighs in the previous minute, and with ABBA one policy's blocks would follow each other in consecutive minutes
    where the other's (and the replay of log A) would not (a pair run so: 9 % more 429s predicted than run B
    refused, docs/BENCHMARKS.md); A, B, A, B... leaves each gateway's previous minute empty. Each gateway serves its
    own blocks only, so each log is one policy's answer to the whole workload, and the machine's other work (which
    no log shows) is the same for both to within a minute."""
    ports: dict[str, int] = {}
    gateways = {}
    for name in LOCAL_SCENARIOS:
        ports[name], log = free_port(), folder / f"requests-{name}.log"
        log.unlink(missing_ok=True)
        argv = [sys.executable, str(Path(__file__).resolve()), "--gateway-child", "--routes",
                str(folder / f"routes-{name}.yaml"), "--policies", str(folder / f"policy-{name}.yaml"),
                "--table", str(table), "--port", str(ports[name]), "--log-file", str(log)]
        gateways[name] = procs.start(f"gateway-{name}", argv, None, folder / f"gateway-{name}.out")
        wait_gateway(ports[name], gateways[name])
    statuses: dict[str, dict[str, int]] = {name: {} for name in LOCAL_SCENARIOS}
    parts = blocks(load, block_s)
    for k, part in enumerate(parts):
        for name in LOCAL_SCENARIOS:
            print(f"block {k + 1}/{len(parts)}, policy {name}: {len(part)} requests ...", file=sys.stderr)
            for status, count in asyncio.run(send_load(f"http://127.0.0.1:{ports[name]}", tagged(part, name))).items():
                statuses[name][status] = statuses[name].get(status, 0) + count
    for name, gateway in gateways.items():
        gateway.terminate()  # drains, then the log is flushed and closed
        gateway.wait(timeout=60)
        print(f"run {name}: statuses {statuses[name]}; {load_line()}", file=sys.stderr)
    return statuses


# --- the gateway process (`--gateway-child`): `gateway serve`'s app with a table for a difficulty classifier ---

def serve_child(args: argparse.Namespace) -> int:
    from gateway import server
    from gateway.accounting.log import configure_logging
    from gateway.accounting.logfile import RotatingLogFile
    from gateway.app import create_app
    from gateway.config import load_config
    from gateway.testing import TableScorer

    table = json.loads(Path(args.table).read_text())
    stream = RotatingLogFile(Path(args.log_file), max_bytes=1 << 30, backups=1, daily=False)
    batched = configure_logging(stream)
    try:
        app = create_app(load_config(Path(args.routes), Path(args.policies)), TableScorer(table))
        server.run(server.serve_until_signal(app, "127.0.0.1", args.port))
    finally:
        batched.close()
    return 0


# --- the load generator (this process) ---

async def send_load(url: str, load: list[Any]) -> dict[str, int]:
    statuses: dict[str, int] = {}
    now = time.time()
    start = (now // 60 + 1) * 60 + PHASE_S  # the next minute's PHASE_S-th second (see the module docstring)
    await asyncio.sleep(start - now)
    started = time.perf_counter()

    async def ask(session: aiohttp.ClientSession, item: Any) -> None:
        at, prompt, _, max_tokens, stream = item
        await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
        body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "stream": stream}
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {API_KEY}"}) as response:
            await response.read()
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=300)) as session:
        await asyncio.gather(*(ask(session, item) for item in load))
    return statuses


def run(procs: Procs, folder: Path, name: str, routes_file: Path, policy_file: Path, table: Path, load: list[Any],
        cpu: int | None) -> tuple[Path, dict[str, int]]:
    port, log = free_port(), folder / f"requests-{name}.log"
    log.unlink(missing_ok=True)  # the log file is appended to: a run's log holds that run only
    argv = [sys.executable, str(Path(__file__).resolve()), "--gateway-child", "--routes", str(routes_file),
            "--policies", str(policy_file), "--table", str(table), "--port", str(port), "--log-file", str(log)]
    gateway = procs.start(f"gateway-{name}", (["taskset", "-c", str(cpu)] if cpu is not None else []) + argv, None,
                          folder / f"gateway-{name}.out")
    wait_gateway(port, gateway)
    statuses = asyncio.run(send_load(f"http://127.0.0.1:{port}", load))
    gateway.terminate()  # drains, then the log is flushed and closed
    gateway.wait(timeout=60)
    return log, statuses


def main_run(args: argparse.Namespace) -> int:
    stop_on_sigterm()
    folder: Path = args.out
    folder.mkdir(parents=True, exist_ok=True)
    load = workload(args.requests, args.rate, seed=args.seed)
    table = folder / "difficulty.json"
    table.write_text(json.dumps({prompt: difficulty for _, prompt, difficulty, _, _ in load}))
    pin = pinning(args.no_pin)
    print(pin.note, file=sys.stderr)
    load_before = os.getloadavg()
    procs = Procs()
    statuses: dict[str, dict[str, int]] = {}
    files: dict[str, tuple[Path, Path]] = {}
    try:
        ports = {(name, i): free_port() for name, _, count, _ in TIERS for i in range(count)}
        urls: dict[str, list[str]] = {}
        for (name, _), port in ports.items():
            urls.setdefault(name, []).append(f"http://127.0.0.1:{port}/v1")
        for name, (tiers, bands, limited, _) in SCENARIOS.items():
            routes_file, policy_file = folder / f"routes-{name}.yaml", folder / f"policy-{name}.yaml"
            routes_file.write_text(yaml.safe_dump(routes(urls, tiers)))
            policy_file.write_text(yaml.safe_dump(policy(bands, args.limit if limited else None)))
            files[name] = (routes_file, policy_file)
        for name in SCENARIOS:
            # fresh emulators per run: the same prompts again would find the last run's prefix cache warm
            for (tier, i), port in ports.items():
                profile = next(p for t, p, _, _ in TIERS if t == tier)
                proc = procs.start(f"emulator-{tier}-{i}", emulator_argv(port, profile, SEED), pin.rest,
                                   folder / f"emulator-{name}-{tier}-{i}.out")
                wait_http(f"http://127.0.0.1:{port}/v1/models", proc, f"emulator {tier}-{i}")
            print(f"run {name} ({args.requests} requests at {args.rate}/s) ...", file=sys.stderr)
            _, statuses[name] = run(procs, folder, name, *files[name], table, load, pin.proxy)
            procs.close()
            print(f"run {name}: statuses {statuses[name]}; {load_line()}", file=sys.stderr)
    except KeyboardInterrupt:
        procs.print_tails()
        return 130
    finally:
        procs.close()
    meta = {"command": command_line(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "pinning": pin.note, "load_before": load_before, "load_after": os.getloadavg(), "statuses": statuses}
    (folder / "runs.json").write_text(json.dumps(meta, indent=1))
    print(markdown(analyse(folder, meta)))
    return 0


def analyse(folder: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """`gateway whatif` on the runs' logs in `folder`: each log against its own policy, B and C predicted from log A;
    compare.json written, returned."""
    results: dict[str, Any] = {}
    scenarios = LOCAL_SCENARIOS if meta.get("stack") == "local" else SCENARIOS
    files = {name: (folder / f"routes-{name}.yaml", folder / f"policy-{name}.yaml") for name in scenarios}
    log_a = folder / "requests-A.log"
    for name, (routes_file, policy_file) in files.items():
        own = folder / f"calibrate-{name}.json"  # each log replayed against its own policy
        run_whatif(["--log", str(folder / f"requests-{name}.log"), "--routes", str(routes_file), "--policies",
                    str(policy_file), "--calibrate", "--json", str(own)])
        results[f"calibrate-{name}"] = json.loads(own.read_text())
        if name == "A":
            continue
        predicted = folder / f"predicted-{name}.json"
        run_whatif(["--log", str(log_a), "--routes", str(routes_file), "--policies", str(policy_file),
                    "--baseline-routes", str(files["A"][0]), "--baseline-policies", str(files["A"][1]),
                    "--json", str(predicted), "--html", str(folder / f"predicted-{name}.html")])
        results[f"predicted-{name}"] = json.loads(predicted.read_text())
    for name in files:
        results[f"calibrate-{name}"]["calibration"]["recorded_p50_spread"] = recorded_p50_spread(
            folder / f"requests-{name}.log", results[f"calibrate-{name}"]["meta"]["window"])
    compare = meta | {
        "own": _short(results["calibrate-A"]["calibration"]),
        "own_physics": results["calibrate-A"]["meta"]["physics"]["baseline"],
        "own_each": {name: {k: results[f"calibrate-{name}"]["calibration"].get(k) for k in OWN_EACH} for name in files},
        "changed": {name: changed(results[f"predicted-{name}"]["candidate"], results[f"calibrate-{name}"]["recorded"])
                    for name in files if name != "A"}}
    (folder / "compare.json").write_text(json.dumps(compare, indent=1))
    return compare


def explain(folder: Path, meta: dict[str, Any]) -> str:
    """Each log of `folder` replayed against its own policy (`--calibrate`), request by request: where the replay's
    TTFT p50 comes from (one replay with the fit's point estimates, not the report's ensemble of draws). Per log:
    the p50 logged and replayed; how many logged TTFTs lie within 10 % of the logged p50 (about half that many
    requests crossing it moves the p50 out of the target); the requests on the other side of the logged p50 in the
    replay than in the log, by tier, kind (streamed first token or whole answer) and cause (the replayed queue wait
    differs by more than half the TTFT's change; else what follows admission; or shed on one side only), net (+:
    more below the p50 in the replay); the p50 error with each request's queue wait the logged one (the replay's
    after admission) and, inversely, the logged TTFT after admission with the replay's wait; and the p50 error with
    every CPU-served tier's fitted decode step 0.5 % shorter or longer (what no fit of a log can pin: where this
    moves the p50 by points, the figure is the queue's chaos, not the physics); and how many of its answers found
    part of their prompt in the backend's cache (`cached_tokens` > 0; the median share of their prompt)."""
    from gateway.config import load_config
    from gateway.whatif.decide import HITS
    from gateway.whatif.replay import replay
    from gateway.whatif.simulate import fit_fleet, fitted_physics, simulate_window
    from gateway.whatif.summary import Tally

    def p50_error(logged: list[float], replayed: list[float], q: float = 50) -> float:
        return 100 * (float(np.percentile(replayed, q)) / float(np.percentile(logged, q)) - 1)

    scenarios = LOCAL_SCENARIOS if meta.get("stack") == "local" else SCENARIOS
    lines = ["| log | p50 logged / replayed | within 10 % of it | across it in the replay: tier kind cause (net) | "
             "p50 error; the log's waits; the replay's waits | decode x0.995 / x1 / x1.005 | prompt found cached |",
             "| --- | --- | ---: | --- | --- | --- | ---: |"]
    for name in scenarios:
        config = load_config(folder / f"routes-{name}.yaml", folder / f"policy-{name}.yaml")
        result = replay([folder / f"requests-{name}.log"], {"baseline": config})
        fleet = fit_fleet(config, result.window, result.samples, replays=1)  # the point fit's single replay
        errors: list[float] = []
        sent: list[Any] = []
        for scale in (0.995, 1.0, 1.005):
            scaled = dataclasses.replace(fleet, tpot_1={k: v * scale for k, v in fleet.tpot_1.items()})
            each = simulate_window("baseline", config, result.window, fitted_physics(config, result.samples, scaled),
                                   Tally())
            logged = [r.ttft_ms for row in result.window.rows if (r := row.rec).served and r.ttft_ms is not None
                      and r.cache not in HITS and r.tier is not None]
            errors.append(p50_error(logged, [a.ttft_ms for _, a in each if a.shed is None and a.ttft_ms is not None]))
            if scale == 1.0:
                sent = each
        replayed = [a.ttft_ms for _, a in sent if a.shed is None and a.ttft_ms is not None]
        p50 = float(np.percentile(logged, 50))
        near = sum(1 for x in logged if abs(x - p50) <= 0.1 * p50)
        across: dict[str, int] = {}
        both = [(r, a) for r, a in sent if r.served and r.ttft_ms is not None and a.shed is None and a.ttft_ms is not None]
        for r, a in sent:
            lt = r.ttft_ms if r.served and r.ttft_ms is not None else None
            st = a.ttft_ms if a.shed is None else None
            below_l, below_s = (None if x is None else x < p50 for x in (lt, st))
            if below_l == below_s:
                continue
            if lt is None or st is None:
                cause = "shed in the log" if lt is None else "shed in the replay"
            else:
                cause = "queue" if abs(a.waited_s * 1000 - r.queue_ms) > 0.5 * abs(st - lt) else "after admission"
            key = f"{a.tier} {'streamed' if r.stream else 'whole'} {cause}"
            across[key] = across.get(key, 0) + (1 if below_s else 0) - (1 if below_l else 0)
        cached = [100 * r.cached / r.prompt for r, _ in sent if r.served and r.cached > 0 and r.prompt > 0]
        swapped = p50_error([r.ttft_ms for r, _ in both], [a.ttft_ms - a.waited_s * 1000 + r.queue_ms for r, a in both])
        inverse = p50_error([r.ttft_ms for r, _ in both], [r.ttft_ms - r.queue_ms + a.waited_s * 1000 for r, a in both])
        lines.append(
            f"| {name} | {p50:,.0f} / {float(np.percentile(replayed, 50)):,.0f} ms ({errors[1]:+.1f} %) | "
            f"{near} of {len(logged)} | {'; '.join(f'{k} {v:+d}' for k, v in sorted(across.items()) if v) or '-'} | "
            f"{p50_error([r.ttft_ms for r, _ in both], [a.ttft_ms for _, a in both]):+.1f} %; {swapped:+.1f} %; "
            f"{inverse:+.1f} % | {' / '.join(f'{e:+.1f}' for e in errors)} % | {len(cached)} of "
            f"{sum(1 for r, _ in sent if r.served)}{f' ({float(np.median(cached)):.0f} %)' if cached else ''} |")
    return "\n".join(lines)


def changed(pred: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    """A changed policy's prediction (from log A) against what its own run recorded."""
    tiers = {}
    for tier in sorted(set(pred["tiers"]) | set(real["tiers"])):
        p, r = pred["tiers"].get(tier, {}), real["tiers"].get(tier, {})
        tiers[tier] = {"share": (p.get("share", 0.0), r.get("share", 0.0)),
                       "cost": (p.get("cost_usd", 0.0), r.get("cost_usd", 0.0)),
                       "p50": (p.get("ttft_p50_ms"), r.get("ttft_p50_ms")),
                       "p99": (p.get("ttft_p99_ms"), r.get("ttft_p99_ms"))}
    refused = {k: (pred["refused"].get(k, 0), real["refused"].get(k, 0))
               for k in sorted(set(pred["refused"]) | set(real["refused"]))}
    return {"tiers": tiers, "cost": (pred["cost_usd"], real["cost_usd"]),
            "p50": (pred["ttft_p50_ms"], real["ttft_p50_ms"]), "p99": (pred["ttft_p99_ms"], real["ttft_p99_ms"]),
            "refused": refused,
            "max_share_points": max(abs(100 * (v["share"][0] - v["share"][1])) for v in tiers.values())}


OWN_EACH = ("ttft_p50", "ttft_p99", "ttft_p50_at", "ttft_p99_at", "recorded_p50_spread")  # each log, its own policy
BOOTSTRAP = 2000  # resamples of a window's recorded TTFTs


def recorded_p50_spread(log: Path, window: dict[str, Any]) -> dict[str, float] | None:
    """The recorded TTFT p50's own sampling error, before any model: the window's TTFTs (those `record_window`
    takes: answered cache misses on a tier) resampled with replacement BOOTSTRAP times (seeded); the standard
    deviation of the resamples' p50 relative to the recorded p50, and the share of resamples more than 10 % from
    it. What another run of the same traffic could show; None without TTFTs."""
    start, end = (datetime.fromisoformat(window[k]).timestamp() for k in ("from", "to"))
    ttfts = np.array([rec.ttft_ms for rec in read_logged([log], LogStats())
                      if start <= rec.arrival < end and rec.served and rec.ttft_ms is not None
                      and rec.cache not in HITS and rec.tier is not None])
    if not len(ttfts):
        return None
    p50 = float(np.median(ttfts))
    draws = np.median(ttfts[np.random.default_rng(40).integers(0, len(ttfts), (BOOTSTRAP, len(ttfts)))], axis=1)
    relative = draws / p50 - 1 if p50 else np.zeros(BOOTSTRAP)
    return {"sd": round(float(relative.std()), 4), "beyond_10_percent": round(float(np.mean(abs(relative) > 0.1)), 4)}


def _short(cal: dict[str, Any]) -> dict[str, Any]:
    return {k: cal.get(k) for k in ("cost", "ttft_p50", "ttft_p99", "ttft_p50_at", "ttft_p99_at", "max_share_points",
                                    "tiers", "refused")}


def _at(quantile: float | None) -> str:
    """' (recorded p47.6)': where a replayed TTFT falls among the recorded ones (`gateway.whatif.calibrate`)."""
    return "" if quantile is None else f" (recorded p{100 * quantile:.1f})"


def _rel(pair: tuple[float | None, float | None]) -> str:
    p, r = pair
    return "-" if p is None or r is None or r == 0 else f"{100 * (p - r) / r:+.1f} %"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def markdown(c: dict[str, Any]) -> str:
    own = c["own"]
    lines = [f"`{c['command']}`, {c['date']}; {c['pinning']}; machine load (os.getloadavg 1/5/15 min) "
             f"{' / '.join(f'{x:.2f}' for x in c['load_before'])} before, "
             f"{' / '.join(f'{x:.2f}' for x in c['load_after'])} after, on {os.cpu_count()} CPUs.", "",
             "Replayed against its own policy (log A, `--calibrate`):", "",
             "| figure | error | target |", "| --- | ---: | ---: |",
             f"| tier shares | {own['max_share_points']:.2f} points | exact |",
             f"| cost | {100 * (own['cost'] or 0):+.2f} % | 1 % |",
             f"| TTFT p50 overall | {100 * (own['ttft_p50'] or 0):+.1f} %{_at(own.get('ttft_p50_at'))} | 10 % |",
             f"| TTFT p99 overall | {100 * (own['ttft_p99'] or 0):+.1f} %{_at(own.get('ttft_p99_at'))} | 20 % |"]
    for tier, t in own["tiers"].items():
        if t.get("ttft_p50") is not None:
            lines.append(f"| TTFT p50 / p99 {tier} | {100 * t['ttft_p50']:+.1f} % / "
                         f"{100 * (t['ttft_p99'] or 0):+.1f} % | 10 % / 20 % |")
    hosts = {tier: p for tier, p in c.get("own_physics", {}).items() if "host_speed" in p}
    if hosts:
        lines += ["", "Fitted on log A (llama.cpp tiers): contention h " + ", ".join(
            sorted({f"{p['host_speed']['contention']:.2f}" for p in hosts.values()})) + "; " + "; ".join(
            f"{tier} batch slope {p['batch_slope']:.2f}, external factor p5 / p50 / p95 "
            f"{' / '.join(f'{v:.2f}' for v in p['host_speed']['factor'].values())}" for tier, p in sorted(hosts.items()))
            + "."]
    lines += ["", "Each run's log against its own policy (`--calibrate`), TTFT p50 / p99 overall: " + "; ".join(
        f"{name} {100 * (e['ttft_p50'] or 0):+.1f} %{_at(e.get('ttft_p50_at'))} / "
        f"{100 * (e['ttft_p99'] or 0):+.1f} %{_at(e.get('ttft_p99_at'))}"
        for name, e in c.get("own_each", {}).items()) + " (in brackets: the recorded TTFTs' percentile at the replayed "
        "figure).", "", "The recorded p50's own sampling error (its window's TTFTs bootstrapped, before any model): " + "; ".join(
        f"{name} SD {100 * spread['sd']:.1f} %, {100 * spread['beyond_10_percent']:.0f} % of resamples more than 10 % off"
        for name, e in c.get("own_each", {}).items() if (spread := e.get("recorded_p50_spread"))) + "."]
    scenarios = LOCAL_SCENARIOS if c.get("stack") == "local" else SCENARIOS
    for name, ch in c["changed"].items():
        lines += ["", f"Policy {name} ({scenarios[name][3]}) predicted from log A, against run {name}:", "",
                  "| figure | predicted | run for real | error | target |", "| --- | ---: | ---: | ---: | ---: |"]
        for tier, t in ch["tiers"].items():
            lines.append(f"| share {tier} | {100 * t['share'][0]:.1f} % | {100 * t['share'][1]:.1f} % | "
                         f"{100 * (t['share'][0] - t['share'][1]):+.1f} points | 2 points |")
        lines.append(f"| cost | ${ch['cost'][0]:.5f} | ${ch['cost'][1]:.5f} | {_rel(ch['cost'])} | 3 % |")
        for reason, pair in ch["refused"].items():
            lines.append(f"| refused {reason} | {pair[0]} | {pair[1]} | {_rel(pair)} | "
                         f"{'10 %' if reason.startswith('rate_limit') else '-'} |")
        lines.append(f"| TTFT p50 overall | {_ms(ch['p50'][0])} ms | {_ms(ch['p50'][1])} ms | {_rel(ch['p50'])} | - |")
        lines.append(f"| TTFT p99 overall | {_ms(ch['p99'][0])} ms | {_ms(ch['p99'][1])} ms | {_rel(ch['p99'])} "
                     f"| 25 % |")
        for tier, t in ch["tiers"].items():
            if t["p99"][1] is not None:
                lines.append(f"| TTFT p50 / p99 {tier} | {_ms(t['p50'][0])} / {_ms(t['p99'][0])} ms | "
                             f"{_ms(t['p50'][1])} / {_ms(t['p99'][1])} ms | {_rel(t['p50'])} / {_rel(t['p99'])} | - |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--limit", type=int, default=300, help="policy B's requests per minute")
    parser.add_argument("--out", type=Path, default=Path("/tmp/whatif-validate"))
    parser.add_argument("--no-pin", action="store_true", help="no CPU of its own for the gateway")
    parser.add_argument("--stack", choices=("emulator", "local"), default="emulator",
                        help="local: make run's llama.cpp tiers (routes/local.yaml), policies A and B only")
    parser.add_argument("--max-out", type=int, default=512, help="max_tokens at most (local: use 64)")
    parser.add_argument("--seed", type=int, default=40, help="the workload's (prompts, arrivals, lengths)")
    parser.add_argument("--interleave", type=float, default=0.0, metavar="S",
                        help="local: runs A and B interleaved in S-second blocks of the workload on the same "
                             "servers (S + 5 <= 60; 0: one run after the other, fresh servers each)")
    parser.add_argument("--analyse", action="store_true",
                        help="no runs: `gateway whatif` again on the logs of an earlier run in --out")
    parser.add_argument("--explain", action="store_true",
                        help="with --analyse: each log against its own policy request by request (where the p50 "
                             "comes from)")
    parser.add_argument("--gateway-child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--routes", "--policies", "--table", "--log-file"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gateway_child:
        return serve_child(args)
    if args.interleave and not 0 < args.interleave <= 60 - PHASE_S:
        parser.error(f"--interleave: a block fits one minute's rate-limit window, 0 < S <= {60 - PHASE_S:g}")
    if args.analyse:
        meta = json.loads((args.out / "runs.json").read_text())
        print(markdown(analyse(args.out, meta)))
        if args.explain:
            print("\n" + explain(args.out, meta))
        return 0
    return main_local(args) if args.stack == "local" else main_run(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
