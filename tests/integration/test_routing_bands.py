"""model 'auto' goes to the tier of the prompt's difficulty band, end to end through the gateway."""

import aiohttp
import pytest
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.testing import TEST_API_KEY, TableScorer, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

BANDS = {"bands": [{"below": 0.35, "tier": "small"}, {"below": 0.7, "tier": "medium"}, {"tier": "large"}]}
TABLE = {"easy one": 0.1, "middling": 0.5, "very hard": 0.95}


async def start(start_emulator: StartEmulator, start_app: StartApp, scorer: TableScorer) -> str:
    tiers = [tier(name, [f"{(await start_emulator()).url}/v1"]) for name in ("small", "medium", "large")]
    config = gateway_config(tiers, policy={"routing": BANDS})
    return await start_app(create_app(config, scorer))


async def ask(url: str, model: str, prompt: str) -> aiohttp.ClientResponse:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            await response.read()
            return response


@pytest.mark.parametrize(("prompt", "expected"), [("easy one", "small"), ("middling", "medium"), ("very hard", "large")])
async def test_auto_follows_the_bands(start_emulator: StartEmulator, start_app: StartApp, prompt: str,
                                      expected: str) -> None:
    url = await start(start_emulator, start_app, TableScorer(TABLE))
    with capture_logs() as logs:
        response = await ask(url, "auto", prompt)
    assert response.status == 200
    assert response.headers["x-gateway-tier"] == expected
    assert float(response.headers["x-gateway-difficulty"]) == pytest.approx(TABLE[prompt])
    line = next(entry for entry in logs if entry["event"] == "request")
    assert (line["tier"], line["difficulty"]) == (expected, TABLE[prompt])


async def test_an_explicit_tier_bypasses_the_classifier(start_emulator: StartEmulator, start_app: StartApp) -> None:
    scorer = TableScorer(TABLE)
    url = await start(start_emulator, start_app, scorer)
    response = await ask(url, "large", "easy one")
    assert response.headers["x-gateway-tier"] == "large"
    assert "x-gateway-difficulty" not in response.headers and scorer.calls == []


async def test_a_failing_classifier_falls_back_to_the_default_tier(start_emulator: StartEmulator,
                                                                   start_app: StartApp) -> None:
    url = await start(start_emulator, start_app, TableScorer(TABLE, error=RuntimeError("model gone")))
    with capture_logs() as logs:
        response = await ask(url, "auto", "very hard")
    assert response.status == 200 and response.headers["x-gateway-tier"] == "small"
    assert any(entry["event"] == "classifier_failed" for entry in logs)
