"""A Responses stream cut by max_output_tokens ends in `response.incomplete` (OpenAI's behaviour), and the openai
SDK's `responses.stream(...).get_final_response()` raises on it, as the README says."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import AsyncOpenAI

from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartEmulator, StartGateway

ROOT = Path(__file__).resolve().parents[2]


async def test_a_stream_cut_by_max_output_tokens_ends_in_response_incomplete(
        start_emulator: StartEmulator, start_gateway: StartGateway) -> None:
    emulator = await start_emulator(seed=3)
    url = await start_gateway(gateway_config([tier("t", [f"{emulator.url}/v1"], tokenizer="emulator")]))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key=TEST_API_KEY)
    stream = await client.responses.create(model="t", input="Tell me about tail latency", max_output_tokens=5,
                                           stream=True)
    events = [event async for event in stream]
    last = events[-1]
    assert last.type == "response.incomplete" and not any(e.type == "response.completed" for e in events)
    assert last.response.status == "incomplete"
    assert last.response.incomplete_details is not None and last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output_text and last.response.usage is not None and last.response.usage.output_tokens == 5
    async with client.responses.stream(model="t", input="Tell me about tail latency", max_output_tokens=5) as cut:
        incomplete = [event async for event in cut if event.type == "response.incomplete"]
        with pytest.raises(RuntimeError, match="response.completed"):
            await cut.get_final_response()  # the SDK's helper wants response.completed: read the events instead
    assert len(incomplete) == 1 and incomplete[0].response.output_text
    readme = (ROOT / "README.md").read_text()
    assert "`response.incomplete`" in readme and "get_final_response()" in readme
