"""model 'auto' routed on predicted per-tier quality (quality_floor), end to end with the openai client: the
tier, the response headers and the request log say what was predicted and why; a failing predictor never fails
a request; a new floor applies on reload."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import load_config
from gateway.state import GATEWAY
from gateway.testing import TEST_API_KEY, TableQualityPredictor, TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

TABLE = {"hi": {"m7b": 0.90, "m51b": 0.93},
         "Prove that there are infinitely many primes.": {"m7b": 0.35, "m51b": 0.85}}
BANDS = {"bands": [{"below": 0.5, "tier": "small"}, {"tier": "large"}]}


async def gateway_url(start_emulator: StartEmulator, start_app: StartApp, predictor: TableQualityPredictor,
                      scorer: TableScorer | None = None) -> str:
    url = f"{(await start_emulator()).url}/v1"
    tiers = [tier("small", [url], output_per_mtok=1.0, quality_model="m7b"),
             tier("large", [url], output_per_mtok=8.0, quality_model="m51b")]
    config = gateway_config(tiers, policy={"quality_floor": 0.05, "routing": BANDS})
    return await start_app(create_app(config, scorer, predictor=predictor))


@pytest.mark.parametrize(("prompt", "expected"), [("hi", "small"),
                                                  ("Prove that there are infinitely many primes.", "large")])
async def test_auto_goes_to_the_cheapest_tier_within_the_floor(start_emulator: StartEmulator, start_app: StartApp,
                                                              prompt: str, expected: str) -> None:
    predictor = TableQualityPredictor(TABLE)
    client = AsyncOpenAI(base_url=f"{await gateway_url(start_emulator, start_app, predictor)}/v1",
                         api_key=TEST_API_KEY)
    with capture_logs() as logs:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-gateway-tier"] == expected
    qualities = dict(pair.split("=") for pair in raw.headers["x-gateway-quality"].split(","))
    assert qualities == {"small": f"{TABLE[prompt]['m7b']:.4f}", "large": f"{TABLE[prompt]['m51b']:.4f}"}
    assert raw.headers["x-gateway-route-reason"].startswith(f"quality: {expected} ")
    line = next(entry for entry in logs if entry["event"] == "request")
    assert line["tier"] == expected and line["quality"] == {"small": TABLE[prompt]["m7b"],
                                                            "large": TABLE[prompt]["m51b"]}
    assert line["route_reason"] == raw.headers["x-gateway-route-reason"]
    assert predictor.calls == [prompt]


async def test_a_failing_predictor_leaves_the_bands_in_charge(start_emulator: StartEmulator,
                                                              start_app: StartApp) -> None:
    predictor = TableQualityPredictor(TABLE, error=RuntimeError("router file gone"))
    url = await gateway_url(start_emulator, start_app, predictor, TableScorer({"hi": 0.9}))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_API_KEY)
    with capture_logs() as logs:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert raw.http_response.status_code == 200 and raw.headers["x-gateway-tier"] == "large"
    assert "x-gateway-quality" not in raw.headers and raw.headers["x-gateway-difficulty"] == "0.9000"
    assert any(entry["event"] == "quality_predictor_failed" for entry in logs)
    line = next(entry for entry in logs if entry["event"] == "request")
    assert line["quality"] is None and line["route_reason"] == "band: difficulty 0.9000 -> large"


async def test_a_new_floor_applies_on_reload(start_emulator: StartEmulator, start_app: StartApp,
                                             tmp_path: Path) -> None:
    emulator = await start_emulator()
    routes, policy = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(f"""
tiers:
  - {{name: small, precision: int4, context_window: 4096, prices: {{input_per_mtok: 1, output_per_mtok: 1}},
     quality_model: m7b, replicas: [{{name: s, url: "{emulator.url}/v1", model: m}}]}}
  - {{name: large, precision: fp16, context_window: 4096, prices: {{input_per_mtok: 1, output_per_mtok: 8}},
     quality_model: m51b, replicas: [{{name: l, url: "{emulator.url}/v1", model: m}}]}}
balancing: {{health_interval_s: 0, scrape_interval_s: 0}}
""")
    key_hash = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
    text = "default_tier: small\nquality_floor: {floor}\ntenants: [{{name: t, api_key_sha256: " + key_hash + "}}]\n"
    policy.write_text(text.format(floor=0.1))
    app = create_app(load_config(routes, policy), predictor=TableQualityPredictor(TABLE),
                     config_files=(routes, policy))
    client = AsyncOpenAI(base_url=f"{await start_app(app)}/v1", api_key=TEST_API_KEY)
    prompt = "Prove that there are infinitely many primes."

    async def tier_for() -> str:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
        return raw.headers["x-gateway-tier"]

    assert await tier_for() == "large"  # 0.35 is not within 0.1 of 0.85
    policy.write_text(text.format(floor=0.6))
    reloader = app[GATEWAY].reloader
    assert reloader is not None and await reloader.reload()
    assert await tier_for() == "small"


async def test_the_shipped_router_and_local_policy_route_the_readme_prompts(start_emulator: StartEmulator,
                                                                          start_app: StartApp) -> None:
    """models/router with policies/local.yaml's floor and routes/local.yaml's quality models (tier names mapped to
    emulator tiers): the README's `hi` goes to the small tier, the Euclid proof to the large one."""
    from gateway.classifier.quality import load_quality_predictor

    root = Path(__file__).resolve().parents[2]
    floor = yaml.safe_load((root / "policies" / "local.yaml").read_text())["quality_floor"]
    local_tiers = yaml.safe_load((root / "routes" / "local.yaml").read_text())["tiers"]
    models = {t["name"]: t["quality_model"] for t in local_tiers if t.get("quality_model")}
    url = f"{(await start_emulator()).url}/v1"
    tiers = [tier("small", [url], input_per_mtok=0.078, output_per_mtok=0.214, quality_model=models["small-q4"]),
             tier("large", [url], input_per_mtok=0.089, output_per_mtok=0.283, quality_model=models["large-f16"])]
    predictor = load_quality_predictor(root / "models" / "router")
    try:
        app = create_app(gateway_config(tiers, policy={"quality_floor": floor}), predictor=predictor)
        client = AsyncOpenAI(base_url=f"{await start_app(app)}/v1", api_key=TEST_API_KEY)
        routed = {}
        for prompt in ("hi", "thanks!", "Prove that there are infinitely many primes and explain Euclid's argument "
                       "step by step.", "Write a lock-free MPMC queue in Rust with benchmarks."):
            raw = await client.chat.completions.with_raw_response.create(
                model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
            routed[prompt[:10]] = raw.headers["x-gateway-tier"]
    finally:
        predictor.close()
    assert routed == {"hi": "small", "thanks!": "small", "Prove that": "large", "Write a lo": "large"}
