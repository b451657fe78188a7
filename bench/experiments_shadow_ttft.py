"""Issue 22: the client-side TTFT of shadowed vs non-shadowed requests under a moderate load.

    .venv/bin/python bench/experiments_shadow_ttft.py [--rate 20] [--requests 600] [--rounds 3] [--share 0.1]

On 127.0.0.1: two emulators (tier `small`: profile int4; tier `large`: profile fp16, the shadow reference),
one gateway (`gateway serve`, no Redis, pinned to its own CPU), and the load generator in this process.
Open-loop Poisson arrivals of streamed chat requests (`--max-tokens` output tokens, ignore_eos) to `small`.
Each round runs two phases on the same gateway, in alternating order: `off` (policy without `shadow:`) and
`on` (`shadow: {share, from: small, to: large}`), switched by rewriting the policy file (hot reload,
confirmed by /readyz's config_version). The request log's `shadow` lines say which requests were shadowed.

Reported: TTFT p50 and p99 with percentile-bootstrap 95 % intervals for the shadowed and the other requests
of the `on` phases and for every request of the `off` phases; and two differences with their intervals:
shadowed - not shadowed (same phases: the request's own cost of being shadowed) and on - off (what the
shadow traffic does to every client). The bootstrap resamples rounds, then requests within them (differences
paired by round): on a shared machine the load drifts from minute to minute, and a request-level bootstrap
would call that drift a difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from gateway.bench.arrivals import poisson_offsets
from gateway.bench.client import send
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.procs import begin, emulator_argv, free_port, free_ports, gateway_argv, wait_gateway, wait_http, workdir
from gateway.bench.report import command_line, load_line, log, md_table

KEY = "sk-bench"


def policy(shadow: float | None, max_tokens: int) -> str:
    tenant: dict[str, Any] = {"name": "team", "key": KEY}
    if shadow is not None:
        tenant["shadow"] = {"share": shadow, "from": "small", "to": "large"}
    return policy_yaml("small", [tenant], max_tokens=max_tokens)


def config_version(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
        return str(json.loads(response.read())["config_version"])


async def switch(path: Path, text: str, port: int, timeout_s: float = 10.0) -> None:
    """Write the policy file and wait until the gateway serves the new version (nothing when it is the same)."""
    if path.read_text() == text:
        return
    before = config_version(port)
    path.write_text(text)
    deadline = time.monotonic() + timeout_s
    while config_version(port) == before:
        if time.monotonic() > deadline:
            raise RuntimeError("the gateway did not reload the policy file")
        await asyncio.sleep(0.1)


async def load(url: str, n: int, rate: float, max_tokens: int, seed: int) -> list[tuple[str, float]]:
    """(x-request-id, TTFT s) of each answered request of `n` Poisson arrivals at `rate`."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int, at: float) -> tuple[str, float] | None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
            body = orjson.dumps({"model": "small", "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                                 "messages": [{"role": "user", "content": f"round {seed} question {i}: why?"}]})
            result = await send(session, f"{url}/v1/chat/completions", body, headers)
            if not result.ok or result.ttft_s is None:
                return None
            return result.headers.get("x-request-id", ""), result.ttft_s

        done = await asyncio.gather(*(one(i, at) for i, at in enumerate(poisson_offsets(n, rate, seed))))
    return [d for d in done if d is not None]


def shadow_lines(log_path: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for line in log_path.read_bytes().splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "shadow":
            out[str(entry["request_id"])] = entry
    return out


Rounds = list[list[float]]  # TTFT seconds, per round


def boot(rounds: Rounds, q: float, picks: np.ndarray[Any, Any], rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """The q-quantile of each resample: the rounds in `picks` (one row per resample), then each chosen round's
    requests resampled within it, so the round-to-round drift of a shared machine widens the interval."""
    out = np.empty(len(picks))
    data = [np.asarray(r) for r in rounds]
    for b, chosen in enumerate(picks):
        out[b] = np.quantile(np.concatenate([data[r][rng.integers(0, len(data[r]), len(data[r]))]
                                             for r in chosen]), q)
    return out


def cell(rounds: Rounds, q: float, n_boot: int, rng: np.random.Generator) -> str:
    picks = rng.integers(0, len(rounds), (n_boot, len(rounds)))
    lo, hi = np.percentile(boot(rounds, q, picks, rng), [2.5, 97.5])
    return f"{np.quantile(np.concatenate(rounds), q) * 1000:.1f} [{lo * 1000:.1f}, {hi * 1000:.1f}]"


def diff(a: Rounds, b: Rounds, q: float, n_boot: int, rng: np.random.Generator) -> str:
    """a - b, paired by round (the same rounds drawn for both)."""
    picks = rng.integers(0, len(a), (n_boot, len(a)))
    d = boot(a, q, picks, rng) - boot(b, q, picks, rng)
    lo, hi = np.percentile(d, [2.5, 97.5])
    verdict = "no difference" if lo <= 0 <= hi else ("slower" if lo > 0 else "faster")
    point = np.quantile(np.concatenate(a), q) - np.quantile(np.concatenate(b), q)
    return f"{point * 1000:+.1f} [{lo * 1000:+.1f}, {hi * 1000:+.1f}] ({verdict})"


async def main(args: argparse.Namespace) -> None:
    run = begin(args.no_pin)
    ttft: dict[str, list[list[tuple[str, float]]]] = {"on": [], "off": []}
    with workdir(run.procs, "shadow-ttft-") as tmp:
        ports = free_ports(2)
        for name, port, profile, seed in (("small", ports[0], "int4", 1), ("large", ports[1], "fp16", 2)):
            # other seeds: the two tiers answer differently, as two models would
            proc = run.procs.start(name, emulator_argv(port, profile, seed), None, tmp / f"{name}.out")
            wait_http(f"http://127.0.0.1:{port}/health", proc, name)
        config = tmp / "config"
        config.mkdir()
        (config / "routes.yaml").write_text(routes_yaml({"small": [("small-a", f"http://127.0.0.1:{ports[0]}/v1")],
                                                         "large": [("large-a", f"http://127.0.0.1:{ports[1]}/v1")]}))
        (config / "policy.yaml").write_text(policy(None, args.max_tokens))
        gw_port, request_log = free_port(), tmp / "requests.log"
        argv = gateway_argv(config / "routes.yaml", config / "policy.yaml", gw_port, request_log, None, run.gw_cpu)
        gateway = run.procs.start("gateway", [*argv, "--shadow-pairs", str(tmp / "pairs.jsonl")], None,
                                  tmp / "gateway.out")
        wait_gateway(gw_port, gateway)
        url = f"http://127.0.0.1:{gw_port}"
        await load(url, 50, args.rate, args.max_tokens, 10_000)  # warm-up (the encoder opens on the first pair)
        for r in range(args.rounds):
            for phase in ("off", "on") if r % 2 == 0 else ("on", "off"):
                await switch(config / "policy.yaml", policy(args.share if phase == "on" else None, args.max_tokens),
                             gw_port)
                got = await load(url, args.requests, args.rate, args.max_tokens, r * 2 + (phase == "on"))
                ttft[phase].append(got)
                log(f"round {r + 1} {phase}: {len(got)}/{args.requests} answered, "
                    f"TTFT p50 {np.median([t for _, t in got]) * 1000:.1f} ms")
                await asyncio.sleep(2.0)  # the shadow queue drains between phases
        run.procs.check_alive()
        shadows = shadow_lines(request_log)
    shadowed = [[t for rid, t in got if rid in shadows] for got in ttft["on"]]
    plain = [[t for rid, t in got if rid not in shadows] for got in ttft["on"]]
    off = [[t for _, t in got] for got in ttft["off"]]
    on = [[t for _, t in got] for got in ttft["on"]]
    rng = np.random.default_rng(0)
    rows = [[name, sum(map(len, v)), cell(v, 0.5, args.bootstrap, rng), cell(v, 0.99, args.bootstrap, rng)]
            for name, v in (("on: shadowed", shadowed), ("on: not shadowed", plain), ("on: all", on), ("off: all", off))]
    print()
    print(f"command: {command_line()}")
    print(load_line())
    costs = [s["shadow_cost_usd"] for s in shadows.values()]
    agreements = [s["agreement"] for s in shadows.values() if s.get("agreement") is not None]
    print(f"{args.rounds} rounds x {args.requests} requests per phase at {args.rate:g} req/s (Poisson), "
          f"{args.max_tokens} output tokens, shadow share {args.share:g}; shadow lines {len(shadows)} "
          f"(cost ${sum(costs):.6f}, mean agreement {np.mean(agreements) if agreements else float('nan'):.3f})")
    print(md_table(["requests", "n", "TTFT p50 ms [95 % CI]", "TTFT p99 ms [95 % CI]"], rows, "--- ---: ---: ---:"))
    print()
    print(md_table(["difference", "p50 ms [95 % CI]", "p99 ms [95 % CI]"], [
        ["shadowed − not shadowed (on)", diff(shadowed, plain, 0.5, args.bootstrap, rng),
         diff(shadowed, plain, 0.99, args.bootstrap, rng)],
        ["on − off (all requests)", diff(on, off, 0.5, args.bootstrap, rng), diff(on, off, 0.99, args.bootstrap, rng)],
    ], "--- ---: ---:"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second (Poisson)")
    parser.add_argument("--requests", type=int, default=600, help="per phase and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--share", type=float, default=0.1, help="shadow share in the `on` phases")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--no-pin", action="store_true")
    asyncio.run(main(parser.parse_args()))
