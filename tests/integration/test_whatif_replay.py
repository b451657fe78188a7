"""`gateway whatif` on a real log: a gateway in front of emulators writes it, the replay reads it back (issue 40).

Against its own policy the replay must give the recorded tier shares exactly and the recorded cost; against a
changed policy (other bands, a tighter rate limit) it must move the shares and the 429s the way the change says.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from gateway.testing import TEST_API_KEY, TableScorer
from gateway.whatif.cli import run_whatif
from tests.conftest import StartApp, StartEmulator

TIERS = ("small", "medium", "large")
PROMPTS = {f"prompt number {i}": round((i % 10) / 10 + 0.05, 2) for i in range(40)}
BANDS: list[dict[str, Any]] = [{"below": 0.35, "tier": "small"}, {"below": 0.7, "tier": "medium"}, {"tier": "large"}]


def write_config(folder: Path, urls: dict[str, str], bands: list[dict[str, Any]], rate: int | None) -> tuple[Path, Path]:
    routes = {"balancing": {"near_tie": 0.0, "explore_after_s": 0.0, "health_interval_s": 0.0,
                            "scrape_interval_s": 0.0},
              "tiers": [{"name": name, "precision": "int4", "context_window": 8192,
                         "prices": {"input_per_mtok": 0.1 * (i + 1) ** 2, "output_per_mtok": 0.4 * (i + 1) ** 2},
                         "replicas": [{"name": f"{name}-0", "url": urls[name], "model": "emulated",
                                       "launch": {"kind": "emulator", "profile": "int4"}}]}
                        for i, name in enumerate(TIERS)]}
    tenant: dict[str, Any] = {"name": "test", "api_key_sha256": hashlib.sha256(TEST_API_KEY.encode()).hexdigest()}
    if rate is not None:
        tenant["rate_limit"] = {"requests_per_min": rate}
    policy = {"default_tier": "small", "max_tokens": {"default": 16, "maximum": 64}, "routing": {"bands": bands},
              "tenants": [tenant]}
    paths = folder / f"routes-{len(bands)}-{rate}.yaml", folder / f"policy-{len(bands)}-{rate}.yaml"
    paths[0].write_text(yaml.safe_dump(routes))
    paths[1].write_text(yaml.safe_dump(policy))
    return paths


async def produce_log(folder: Path, start_emulator: StartEmulator, start_app: StartApp) -> tuple[Path, dict[str, str]]:
    urls = {name: f"{(await start_emulator('int4', seed=i)).url}/v1" for i, name in enumerate(TIERS)}
    routes, policy = write_config(folder, urls, BANDS, None)
    url = await start_app(create_app(load_config(routes, policy), TableScorer(PROMPTS)))
    semaphore = asyncio.Semaphore(6)

    async def ask(session: aiohttp.ClientSession, prompt: str, stream: bool) -> None:
        body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 12,
                "stream": stream, "temperature": 0}
        async with semaphore, session.post(f"{url}/v1/chat/completions", json=body,
                                           headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            assert response.status == 200
            await response.read()

    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(ask(session, prompt, i % 2 == 0) for i, prompt in enumerate(PROMPTS)))
            await ask(session, "prompt number 3", False)  # asked again: answered from the cache? no Redis: a miss
    lines = [entry for entry in logs if entry.get("event") == "request"]
    log = folder / "requests.log"
    log.write_bytes(b"\n".join(orjson.dumps(line, default=str) for line in lines) + b"\n")
    return log, urls


def whatif(log: Path, routes: Path, policy: Path, base: tuple[Path, Path], out: Path) -> dict[str, Any]:
    assert run_whatif(["--log", str(log), "--routes", str(routes), "--policies", str(policy),
                       "--baseline-routes", str(base[0]), "--baseline-policies", str(base[1]),
                       "--json", str(out), "--html", str(out.with_suffix(".html"))]) == 0
    doc: dict[str, Any] = orjson.loads(out.read_bytes())
    return doc


async def test_whatif_replays_a_real_log(tmp_path: Path, start_emulator: StartEmulator, start_app: StartApp) -> None:
    log, urls = await produce_log(tmp_path, start_emulator, start_app)
    line = orjson.loads(log.read_bytes().splitlines()[0])
    assert line["replay"] == 3 and line["reading"]["outputs"] == 1 and line["reading"]["digest"]
    assert line["turn_keys"]["parent"] is None and len(line["turn_keys"]["current"]) == 32  # a first turn
    assert isinstance(line["sticky"]["conversation"], int) and "conversation" not in line
    assert "prompt number" not in log.read_text()  # numbers and digests, no prompt text
    own = write_config(tmp_path, urls, BANDS, None)

    same = whatif(log, *own, own, tmp_path / "own.json")
    recorded, baseline, candidate = same["recorded"], same["baseline"], same["candidate"]
    assert recorded["requests"] == baseline["requests"] == candidate["requests"] == len(PROMPTS) + 1
    assert same["meta"]["price_only"] == 0
    assert same["meta"]["replays"] == 16  # a small window: the ensemble's most draws (`simulate.ensemble_size`)
    for tier in TIERS:
        assert baseline["tiers"][tier]["requests"] == recorded["tiers"][tier]["requests"] > 0
        assert baseline["tiers"][tier]["share"] == recorded["tiers"][tier]["share"]
        assert baseline["tiers"][tier]["ttft_p50_ms"] is not None
    assert candidate["cost_usd"] == pytest.approx(recorded["cost_usd"], rel=0.01)
    assert same["calibration"]["max_share_points"] == 0.0
    at = same["calibration"]["ttft_p50_at"]  # where the replayed p50 falls among the recorded TTFTs
    assert at is not None and 0.0 <= at <= 1.0 and same["calibration"]["tiers"]["large"]["ttft_p99_at"] is not None

    everything_large: list[dict[str, Any]] = [{"tier": "large"}]
    changed = write_config(tmp_path, urls, everything_large, 10)
    moved = whatif(log, *changed, own, tmp_path / "changed.json")
    candidate = moved["candidate"]
    assert set(candidate["tiers"]) == {"large", "(none)"}  # one band, and a rate limit of 10 a minute
    assert candidate["refused"] == {"rate_limit_requests": len(PROMPTS) + 1 - 10}
    assert candidate["tiers"]["large"]["requests"] == 10
    assert moved["baseline"]["tiers"] == same["baseline"]["tiers"]
    per_request = candidate["cost_usd"] / 10
    assert per_request > recorded["cost_usd"] / recorded["requests"]  # the large tier is the dearest
    assert (tmp_path / "changed.html").read_text().startswith("<!doctype html>")
    assert "<script" not in (tmp_path / "changed.html").read_text()
