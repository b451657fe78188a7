"""The shipped difficulty model routes model 'auto' through the gateway, and feeds the semantic cache."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.classifier.difficulty import DifficultyClassifier, load_classifier
from gateway.config import GatewayConfig, PolicyConfig
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["hi", "thanks!", "Write a lock-free MPMC queue in Rust with benchmarks.",
           "Explain the difference between TCP and UDP.", "Translate 'good morning' into French.",
           "Prove that there are infinitely many primes and explain Euclid's argument step by step."]
SMALL = {"hi", "thanks!", "Translate 'good morning' into French."}
LARGE = {"Write a lock-free MPMC queue in Rust with benchmarks.",
         "Prove that there are infinitely many primes and explain Euclid's argument step by step."}


def local_bands() -> list[dict[str, object]]:
    """The bands of policies/local.yaml (what `make run` serves), with its tier names mapped to small/large."""
    bands = yaml.safe_load((ROOT / "policies" / "local.yaml").read_text())["routing"]["bands"]
    names = {"small-q4": "small", "large-f16": "large"}
    return [{**band, "tier": names[band["tier"]]} for band in bands]


@pytest.fixture
async def classifier() -> AsyncIterator[DifficultyClassifier]:
    model = load_classifier(ROOT / "models" / "difficulty")
    yield model
    await model.aclose()


def with_policy(base: GatewayConfig, **policy: object) -> GatewayConfig:
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate({**base.policy.model_dump(), **policy}))


async def ask(session: aiohttp.ClientSession, url: str, prompt: str,
              **body: object) -> tuple[str, str | None, str | None]:
    payload = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 2, **body}
    async with session.post(f"{url}/v1/chat/completions", json=payload,
                            headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
        assert response.status == 200
        return (response.headers["x-gateway-tier"], response.headers.get("x-gateway-difficulty"),
                response.headers.get("x-gateway-cache"))


async def test_the_shipped_model_routes_auto_by_its_bands(start_emulator: StartEmulator, start_app: StartApp,
                                                          classifier: DifficultyClassifier) -> None:
    emulator = await start_emulator()
    base = gateway_config([tier("small", [f"{emulator.url}/v1"]), tier("large", [f"{emulator.url}/v1"])])
    bands = local_bands()
    cut = float(bands[0]["below"])  # type: ignore[arg-type]
    config = with_policy(base, routing={"bands": bands})
    url = await start_app(create_app(config, classifier))
    expected = {p: await classifier.score(p) for p in PROMPTS}
    async with aiohttp.ClientSession() as session:
        with capture_logs() as logs:
            routed = {p: await ask(session, url, p) for p in PROMPTS}
    for prompt, (tier_name, difficulty, _) in routed.items():
        assert difficulty is not None and float(difficulty) == pytest.approx(expected[prompt], abs=1e-4)
        assert tier_name == ("small" if expected[prompt] < cut else "large")
    assert {p for p, (t, _, _) in routed.items() if t == "small"} >= SMALL  # greetings go small, proofs large
    assert {p for p, (t, _, _) in routed.items() if t == "large"} >= LARGE
    assert all(0 <= e["difficulty"] <= 1 for e in logs if e["event"] == "request")


async def test_the_semantic_cache_serves_a_paraphrase_but_not_an_unrelated_prompt(
        start_emulator: StartEmulator, start_app: StartApp, classifier: DifficultyClassifier, redis_url: str) -> None:
    emulator = await start_emulator()
    base = gateway_config([tier("t", [f"{emulator.url}/v1"])])
    config = with_policy(base, cache={"semantic": {"threshold": 0.9}})
    url = await start_app(create_app(config, classifier, redis_url))
    async with aiohttp.ClientSession() as session:
        await ask(session, url, "What is the capital city of France?", model="t", temperature=0)
        await asyncio.sleep(0.3)  # the answer and its vector are stored in the background
        paraphrase = await ask(session, url, "What's the capital city of France?", model="t", temperature=0)
        unrelated = await ask(session, url, "How do I bake sourdough bread?", model="t", temperature=0)
    assert paraphrase[2] == "semantic-hit"
    assert unrelated[2] is None
    assert emulator.engine.stats.received == 2
