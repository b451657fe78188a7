"""What a client of the gateway sees when the upstream hop cannot be written (issue 29): a replica key HTTP/1.1
cannot carry fails that replica over to the next, and with none left the answer is a 502 in the OpenAI error
shape naming the header, not a UnicodeEncodeError 500."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.config import Tier
from gateway.testing import TEST_API_KEY, gateway_config
from tests.conftest import StartEmulator, StartGateway


def tier_with_keys(urls_and_envs: list[tuple[str, str]]) -> Tier:
    return Tier.model_validate({
        "name": "t", "precision": "int4", "context_window": 8192,
        "prices": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        "replicas": [{"name": f"t-{i}", "url": url, "model": "emulated", "api_key_env": env}
                     for i, (url, env) in enumerate(urls_and_envs)],
    })


async def ask(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {TEST_API_KEY}"},
                                json={"model": "t", "messages": [{"role": "user", "content": "hello"}]}) as response:
            return response.status, await response.json()


async def test_a_key_outside_latin_1_fails_over_then_502_naming_the_header(
        start_emulator: StartEmulator, start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    emulator = await start_emulator()
    monkeypatch.setenv("EURO_KEY", "sk-\u20ac")
    monkeypatch.setenv("PLAIN_KEY", "sk-plain")
    fails_over = await start_gateway(gateway_config([tier_with_keys([(f"{emulator.url}/v1", "EURO_KEY"),
                                                                     (f"{emulator.url}/v1", "PLAIN_KEY")])]))
    status, answer = await ask(fails_over)
    assert status == 200 and answer["choices"]

    only_bad = await start_gateway(gateway_config([tier_with_keys([(f"{emulator.url}/v1", "EURO_KEY")])]))
    status, answer = await ask(only_bad)
    error = answer["error"]
    assert status == 502 and isinstance(error, dict)
    assert error["type"] == "upstream_error" and "'Authorization'" in error["message"]
    assert "Latin-1" in error["message"]
