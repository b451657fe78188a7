"""A max_tokens the policy lowered is said in `x-gateway-max-tokens-clamped` and in the log line."""

from __future__ import annotations

import aiohttp
from structlog.testing import capture_logs

from tests.conftest import StartApp, StartEmulator
from tests.integration.test_policy_rules import AUTH, gateway, post

HEADER = "x-gateway-max-tokens-clamped"


def request_lines(logs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [line for line in logs if line.get("event") == "request"]


async def test_a_clamp_by_the_maximum_is_said_in_a_header_and_the_log(start_emulator: StartEmulator,
                                                                      start_app: StartApp) -> None:
    url, _ = await gateway(start_emulator, start_app, max_tokens={"default": 4, "maximum": 6})
    with capture_logs() as logs:
        status, answer, headers = await post(url, max_tokens=50, ignore_eos=True)
        _, _, unclamped = await post(url, max_tokens=5, ignore_eos=True)
        _, _, defaulted = await post(url, ignore_eos=True)  # asked nothing: the default is no clamp
    assert status == 200 and answer["usage"]["completion_tokens"] == 6
    assert headers[HEADER] == "50->6"
    assert HEADER not in unclamped and HEADER not in defaulted
    lines = request_lines(logs)
    assert [(line["max_tokens"], line["max_tokens_clamped_from"]) for line in lines] == [(6, 50), (5, None),
                                                                                         (4, None)]


async def test_a_clamp_by_the_output_cap_is_said_on_a_stream(start_emulator: StartEmulator,
                                                             start_app: StartApp) -> None:
    url, _ = await gateway(start_emulator, start_app, output_cap={"tokens": 3})
    body = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 20,
            "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=AUTH) as response:
            assert response.status == 200 and response.headers[HEADER] == "20->3"
            await response.read()
