"""`gateway whatif` against real runs on the emulator fleet (issue 40): replayed against its own policy, and a
changed policy predicted then run for real on the same traffic.

    .venv/bin/python bench/whatif_validate.py [--requests 1200] [--rate 12] [--out /tmp/whatif-validate]

One process serves the emulator fleet (small 2 x int4, medium 1 x int8, large 1 x fp16 replicas: the emulator's
A100 physics, running in real time) and the gateway (bands on a difficulty table: each prompt's score is fixed,
as a classifier's would be), with no Redis (local limits, no response cache). A bounded open-loop load (Poisson
arrivals at --rate, max_tokens drawn per request) is sent twice with the same prompts at the same offsets:

  run A   policy A (bands 0.5 / 0.8, no rate limit)         -> log A
  run B   policy B (bands 0.3 / 0.6, 400 requests a minute)  -> log B

then `gateway whatif --log A` (i) against policy A (--calibrate: the replay against what log A recorded) and
(ii) with candidate policy B, whose prediction is compared with what log B recorded. Prints both comparisons.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from gateway.emulator.harness import serve_emulator
from gateway.emulator.profiles import get_profile
from gateway.server import running
from gateway.testing import TEST_API_KEY, TableScorer
from gateway.whatif.cli import run_whatif

FLEET = (("small", "int4", 2), ("medium", "int8", 1), ("large", "fp16", 1))
PRICES = {"small": (0.05, 0.2), "medium": (0.15, 0.6), "large": (0.5, 2.0)}


def routes(urls: dict[str, list[str]]) -> dict[str, Any]:
    return {"balancing": {"health_interval_s": 0.0, "scrape_interval_s": 0.0},
            "tiers": [{"name": name, "precision": profile, "context_window": 32768,
                       "prices": {"input_per_mtok": PRICES[name][0], "output_per_mtok": PRICES[name][1]},
                       "replicas": [{"name": f"{name}-{i}", "url": url, "model": "emulated",
                                     "launch": {"kind": "emulator", "profile": profile}}
                                    for i, url in enumerate(urls[name])]}
                      for name, profile, _ in FLEET]}


def policy(cuts: tuple[float, float], rate: int | None) -> dict[str, Any]:
    tenant: dict[str, Any] = {"name": "bench", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}
    if rate is not None:
        tenant["rate_limit"] = {"requests_per_min": rate}
    bands = [{"below": cuts[0], "tier": "small"}, {"below": cuts[1], "tier": "medium"}, {"tier": "large"}]
    return {"default_tier": "small", "max_tokens": {"default": 128, "maximum": 1024}, "routing": {"bands": bands},
            "tenants": [tenant]}


def workload(count: int, rate: float, seed: int = 40) -> list[tuple[float, str, float, int, bool]]:
    rng = random.Random(seed)
    at, out = 0.0, []
    for i in range(count):
        at += rng.expovariate(rate)
        words = " ".join(f"w{rng.randrange(5000)}" for _ in range(int(rng.lognormvariate(4.5, 0.8))))
        out.append((at, f"request {i}: {words}", rng.random(), int(min(512, rng.lognormvariate(4.6, 0.7))) + 1,
                    rng.random() < 0.7))
    return out


async def run(folder: Path, name: str, routes_file: Path, policy_file: Path, load: list[Any]) -> Path:
    scorer = TableScorer({prompt: difficulty for _, prompt, difficulty, _, _ in load})
    app = create_app(load_config(routes_file, policy_file), scorer)
    async with running(app) as url:
        started = time.perf_counter()

        async def ask(session: aiohttp.ClientSession, item: Any) -> None:
            at, prompt, _, max_tokens, stream = item
            await asyncio.sleep(max(0.0, started + at - time.perf_counter()))
            body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                    "stream": stream}
            async with session.post(f"{url}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
                await response.read()

        with capture_logs() as logs:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
                await asyncio.gather(*(ask(session, item) for item in load))
            await asyncio.sleep(0.2)
    log = folder / f"requests-{name}.log"
    log.write_bytes(b"\n".join(orjson.dumps(entry, default=str) for entry in logs
                               if entry.get("event") == "request") + b"\n")
    return log


async def main_async(args: argparse.Namespace) -> int:
    folder: Path = args.out
    folder.mkdir(parents=True, exist_ok=True)
    load = workload(args.requests, args.rate)
    async with contextlib.AsyncExitStack() as stack:
        urls: dict[str, list[str]] = {}
        seed = 0
        for name, profile, count in FLEET:
            for _ in range(count):
                seed += 1
                emulator = await stack.enter_async_context(serve_emulator(get_profile(profile), seed, None))
                urls.setdefault(name, []).append(f"{emulator.url}/v1")
        routes_file = folder / "routes.yaml"
        routes_file.write_text(yaml.safe_dump(routes(urls)))
        files = {}
        for name, cuts, rate in (("A", (0.5, 0.8), None), ("B", (0.3, 0.6), args.limit)):
            files[name] = folder / f"policy-{name}.yaml"
            files[name].write_text(yaml.safe_dump(policy(cuts, rate)))
        log_a = await run(folder, "A", routes_file, files["A"], load)
        log_b = await run(folder, "B", routes_file, files["B"], load)
    own, predicted, real = folder / "calibrate.json", folder / "predicted.json", folder / "real-B.json"
    run_whatif(["--log", str(log_a), "--routes", str(routes_file), "--policies", str(files["A"]), "--calibrate",
                "--json", str(own)])
    run_whatif(["--log", str(log_a), "--routes", str(routes_file), "--policies", str(files["B"]),
                "--baseline-policies", str(files["A"]), "--baseline-routes", str(routes_file),
                "--json", str(predicted), "--html", str(folder / "predicted.html")])
    run_whatif(["--log", str(log_b), "--routes", str(routes_file), "--policies", str(files["B"]), "--calibrate",
                "--json", str(real)])
    report(json.loads(own.read_text()), json.loads(predicted.read_text()), json.loads(real.read_text()))
    return 0


def report(own: dict[str, Any], predicted: dict[str, Any], real: dict[str, Any]) -> None:
    print("## Replayed against its own policy (log A, calibrate)")
    print(json.dumps(_short(own["calibration"]), indent=1))
    print("## Policy B predicted from log A vs run for real (log B)")
    cand, rec = predicted["candidate"], real["recorded"]
    rows = {}
    for tier in sorted(set(cand["tiers"]) | set(rec["tiers"])):
        p, r = cand["tiers"].get(tier, {}), rec["tiers"].get(tier, {})
        rows[tier] = {"share_pred": p.get("share"), "share_real": r.get("share"), "cost_pred": p.get("cost_usd"),
                      "cost_real": r.get("cost_usd"), "p99_pred": p.get("ttft_p99_ms"), "p99_real": r.get("ttft_p99_ms"),
                      "p50_pred": p.get("ttft_p50_ms"), "p50_real": r.get("ttft_p50_ms")}
    print(json.dumps({"tiers": rows, "cost_pred": cand["cost_usd"], "cost_real": rec["cost_usd"],
                      "p99_pred": cand["ttft_p99_ms"], "p99_real": rec["ttft_p99_ms"],
                      "refused_pred": cand["refused"], "refused_real": rec["refused"]}, indent=1))


def _short(cal: dict[str, Any]) -> dict[str, Any]:
    return {k: cal[k] for k in ("cost", "ttft_p50", "ttft_p99", "max_share_points", "tiers", "refused")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--rate", type=float, default=12.0)
    parser.add_argument("--limit", type=int, default=400, help="policy B's requests per minute")
    parser.add_argument("--out", type=Path, default=Path("/tmp/whatif-validate"))
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
