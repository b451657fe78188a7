"""A quality_floor added by hot reload when no tenant had one at start (issue 38): the gateway started without a
quality predictor (none was needed), and the reload that first needs it loads it, from the policy's
`quality_predictor` folder (here a copy of models/router elsewhere: a relocated router folder), so that tenant
routes by predicted quality at once; the predictor a reload loaded is closed with the app."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from openai import AsyncOpenAI

from gateway.app import create_app
from gateway.config import load_config
from gateway.state import GATEWAY
from gateway.testing import TEST_API_KEY
from tests.conftest import StartApp, StartEmulator

ROOT = Path(__file__).resolve().parents[2]


async def test_a_floor_first_added_by_reload_loads_the_predictor(start_emulator: StartEmulator,
                                                                 start_app: StartApp, tmp_path: Path) -> None:
    emulator = await start_emulator()
    router = tmp_path / "elsewhere" / "router"
    shutil.copytree(ROOT / "models" / "router", router)
    routes, policy = tmp_path / "routes.yaml", tmp_path / "policy.yaml"
    routes.write_text(f"""
tiers:
  - {{name: small, precision: int4, context_window: 4096, prices: {{input_per_mtok: 0.08, output_per_mtok: 0.2}},
     quality_model: mistral-7b-instruct-v0.3, replicas: [{{name: s, url: "{emulator.url}/v1", model: m}}]}}
  - {{name: large, precision: fp16, context_window: 4096, prices: {{input_per_mtok: 0.09, output_per_mtok: 0.3}},
     quality_model: llama-3.3-nemotron-super-49b-v1, replicas: [{{name: l, url: "{emulator.url}/v1", model: m}}]}}
balancing: {{health_interval_s: 0, scrape_interval_s: 0}}
""")
    key_hash = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
    tenants = f"tenants: [{{name: t, api_key_sha256: {key_hash}}}]\n"
    policy.write_text("default_tier: small\n" + tenants)
    app = create_app(load_config(routes, policy), config_files=(routes, policy))
    gateway = app[GATEWAY]
    assert gateway.predictor is None  # no tenant routes by quality: nothing loaded at start
    client = AsyncOpenAI(base_url=f"{await start_app(app)}/v1", api_key=TEST_API_KEY)

    async def ask(prompt: str) -> dict[str, str]:
        raw = await client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=4)
        return dict(raw.headers)

    proof = "Prove that there are infinitely many primes and explain Euclid's argument step by step."
    before = await ask(proof)
    assert before["x-gateway-tier"] == "small" and "x-gateway-quality" not in before
    policy.write_text(f"default_tier: small\nquality_floor: 0.05\nquality_predictor: {router}\n" + tenants)
    reloader = gateway.reloader
    assert reloader is not None
    assert await reloader.reload(), reloader.state.last_error
    after = await ask(proof)
    qualities = dict(pair.split("=") for pair in after["x-gateway-quality"].split(","))
    assert set(qualities) == {"small", "large"}
    assert after["x-gateway-route-reason"].startswith("quality: ")
    assert after["x-gateway-tier"] == "large"
    assert (await ask("hi"))["x-gateway-tier"] == "small"
    loaded = gateway.predictor
    assert loaded is not None and gateway.predictor_owned
    assert await reloader.reload() and gateway.predictor is loaded  # loaded once, not on every reload
