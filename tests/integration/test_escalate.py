"""Escalation end to end (issue 39): two emulator tiers, the emulator's own log-probabilities. An answer of the small
tier below the tenant's min_confidence is asked again of the large tier and that answer returned (header, the log
line's escalated_from, both parts' tokens and cost); a confident one is not; neither shows the log-probabilities
the gateway asked for unless the client asked."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import MutableMapping, Sequence
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from aiohttp import web

from gateway.app import create_app
from gateway.state import GATEWAY
from gateway.config import GatewayConfig
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

# the emulator's log-probabilities are a function of the prompt: these two answers' confidences (4 tokens)
UNSURE, SURE = "question 0", "question 11"  # ~0.48 and ~0.93 on the small tier
MIN_CONFIDENCE = 0.7


def config(small_url: str, large_url: str, escalate: dict[str, Any] | None) -> GatewayConfig:
    small = tier("small", [f"{small_url}/v1"], input_per_mtok=1.0, output_per_mtok=2.0)
    large = tier("large", [f"{large_url}/v1"], input_per_mtok=10.0, output_per_mtok=20.0, precision="fp16")
    policy: dict[str, Any] = {"default_tier": "small"}
    if escalate is not None:
        policy["escalate"] = escalate
    return gateway_config([small, large], policy=policy)


async def ask(url: str, prompt: str, **extra: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 4, **extra}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            return response.status, dict(response.headers), await response.json()


async def escalations(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as response:
            text = await response.text()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^gateway_escalations_total\{outcome="(\w+)"\} (\S+)$', text, re.M)}


APPS: list[web.Application] = []


async def gateway(start_emulator: StartEmulator, start_app: StartApp, escalate: dict[str, Any] | None) -> str:
    small, large = await start_emulator("instant", seed=1), await start_emulator("instant", seed=2)
    app = create_app(config(small.url, large.url, escalate))
    APPS[:] = [app]
    return await start_app(app)


def nothing_held() -> None:
    """Every lease ended (each replica's in flight back to 0) and every admission slot given back."""
    gateway = APPS[0][GATEWAY]
    assert {name: state.in_flight for name, state in gateway.pool.states().items()} == {"small-0": 0, "large-0": 0}
    assert gateway.path is not None and all(gate.in_flight == 0 for gate in gateway.path.admission.gates.values())


def request_line(logs: Sequence[MutableMapping[str, Any]]) -> MutableMapping[str, Any]:
    return next(entry for entry in logs if entry.get("event") == "request")


async def test_a_low_confidence_answer_escalates_and_both_parts_are_priced(start_emulator: StartEmulator,
                                                                          start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": MIN_CONFIDENCE})
    with capture_logs() as logs:
        status, headers, answer = await ask(url, UNSURE)
    assert status == 200
    assert headers["x-gateway-tier"] == "large" and headers["x-gateway-escalated-from"] == "small"
    assert answer["choices"][0].get("logprobs") is None  # asked by the gateway, not by the client
    line = request_line(logs)
    assert line["tier"] == "large" and line["escalated_from"] == "small"
    escalation = line["escalation"]
    assert escalation["outcome"] == "escalated" and escalation["confidence"] < MIN_CONFIDENCE
    first, second = escalation["parts"]
    assert first["tier"] == "small" and second["tier"] == "large"
    for part in (first, second):
        assert part["prompt_tokens"] > 0 and part["completion_tokens"] == 4 and part["cost_usd"] > 0
    assert first["cost_usd"] == pytest.approx((first["prompt_tokens"] * 1 + 4 * 2) / 1e6)
    assert second["cost_usd"] == pytest.approx((second["prompt_tokens"] * 10 + 4 * 20) / 1e6)
    assert line["cost_usd"] == pytest.approx(first["cost_usd"] + second["cost_usd"])
    assert (await escalations(url))["escalated"] == 1
    nothing_held()


async def test_a_confident_answer_stays_and_keeps_the_clients_logprobs_only_when_asked(
        start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": MIN_CONFIDENCE})
    with capture_logs() as logs:
        status, headers, answer = await ask(url, SURE)
    assert status == 200 and headers["x-gateway-tier"] == "small" and "x-gateway-escalated-from" not in headers
    assert answer["choices"][0].get("logprobs") is None
    line = request_line(logs)
    assert line["escalated_from"] is None and line["escalation"]["outcome"] == "kept"
    assert line["escalation"]["confidence"] >= MIN_CONFIDENCE and "parts" not in line["escalation"]
    assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] * 1 + 4 * 2) / 1e6)
    status, headers, answer = await ask(url, SURE, logprobs=True)  # the client's own: kept
    assert status == 200 and len(answer["choices"][0]["logprobs"]["content"]) == 4
    assert (await escalations(url)) == {"kept": 2, "escalated": 0, "no_confidence": 0, "no_replica": 0, "shed": 0,
                                        "failed": 0}


async def test_without_escalate_nothing_is_asked_or_escalated(start_emulator: StartEmulator,
                                                               start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, None)
    with capture_logs() as logs:
        status, headers, _ = await ask(url, UNSURE)
    assert status == 200 and headers["x-gateway-tier"] == "small" and "x-gateway-escalated-from" not in headers
    assert request_line(logs)["escalated_from"] is None and request_line(logs)["escalation"] is None
    assert sum((await escalations(url)).values()) == 0


async def test_n_above_one_never_escalates(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": 1.0})  # every answer is below 1
    status, headers, answer = await ask(url, UNSURE, n=2)
    assert status == 200 and headers["x-gateway-tier"] == "small" and "x-gateway-escalated-from" not in headers
    assert len(answer["choices"]) == 2


async def test_completions_escalate_too(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": 0.95})  # every 4-token answer here is below
    body = {"model": "auto", "prompt": UNSURE, "max_tokens": 4}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/completions", json=body,
                                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
                assert response.status == 200 and response.headers["x-gateway-escalated-from"] == "small"
                answer = await response.json()
    assert answer["choices"][0].get("logprobs") is None
    assert [part["tier"] for part in request_line(logs)["escalation"]["parts"]] == ["small", "large"]


async def test_a_failed_escalation_returns_the_first_answer(start_emulator: StartEmulator,
                                                            start_app: StartApp) -> None:
    small = await start_emulator("instant", seed=1)
    cfg = config(small.url, "http://127.0.0.1:9", {"min_confidence": MIN_CONFIDENCE})  # nothing listens there
    url = await start_app(create_app(cfg))
    with capture_logs() as logs:
        status, headers, answer = await ask(url, UNSURE)
    assert status == 200 and headers["x-gateway-tier"] == "small" and "x-gateway-escalated-from" not in headers
    assert answer["choices"][0].get("logprobs") is None and answer["choices"][0]["message"]["content"]
    line = request_line(logs)
    assert line["escalated_from"] is None and line["escalation"]["outcome"] == "failed"
    assert line["tier"] == "small" and line["error"] is None and line["completion_tokens"] == 4
    assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] * 1 + 4 * 2) / 1e6)
    assert (await escalations(url))["failed"] == 1


async def stream(url: str, prompt: str, **extra: Any) -> tuple[dict[str, str], list[dict[str, Any]]]:
    body = {"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "stream": True,
            **extra}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", json=body,
                                headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
            assert response.status == 200
            text = (await response.read()).decode()
            events = [json.loads(line[6:]) for line in text.splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            return dict(response.headers), events


def content(events: list[dict[str, Any]]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


async def test_a_held_stream_below_the_minimum_streams_from_the_next_tier(start_emulator: StartEmulator,
                                                                         start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": MIN_CONFIDENCE, "hold_tokens": 4})
    with capture_logs() as logs:
        headers, events = await stream(url, UNSURE)
    assert headers["x-gateway-escalated-from"] == "small" and headers["x-gateway-tier"] == "large"
    assert all(e["choices"][0].get("logprobs") is None for e in events if e.get("choices"))
    line = request_line(logs)
    assert line["tier"] == "large" and line["escalated_from"] == "small" and line["status"] == 200
    escalation = line["escalation"]
    assert escalation["outcome"] == "escalated" and escalation["hold_tokens"] == 4
    first, second = escalation["parts"]
    assert first["tier"] == "small" and first["completion_tokens"] >= 4 and first["cost_usd"] > 0
    assert second["tier"] == "large" and second["completion_tokens"] == 8 and second["cost_usd"] > 0
    assert line["completion_tokens"] == 8 and len(content(events)) > 0
    assert line["cost_usd"] == pytest.approx(first["cost_usd"] + second["cost_usd"])
    nothing_held()


async def test_a_confident_held_stream_is_sent_whole_from_its_tier(start_emulator: StartEmulator,
                                                                   start_app: StartApp) -> None:
    small = await start_emulator("instant", seed=1)
    url = await start_app(create_app(config(small.url, "http://127.0.0.1:9",
                                            {"min_confidence": MIN_CONFIDENCE, "hold_tokens": 4})))
    with capture_logs() as logs:
        headers, events = await stream(url, SURE)
    assert headers["x-gateway-tier"] == "small" and "x-gateway-escalated-from" not in headers
    assert all(e["choices"][0].get("logprobs") is None for e in events if e.get("choices"))
    assert sum(1 for e in events if e.get("choices") and e["choices"][0]["delta"].get("content")) == 8  # all of it
    line = request_line(logs)
    assert line["escalation"]["outcome"] == "kept" and line["completion_tokens"] == 8 and line["status"] == 200
    _, asked = await stream(url, SURE, logprobs=True)  # the client's own log-probabilities reach it
    assert sum(len(e["choices"][0]["logprobs"]["content"]) for e in asked
               if e.get("choices") and e["choices"][0].get("logprobs")) == 8


async def test_a_stream_is_not_held_without_hold_tokens(start_emulator: StartEmulator, start_app: StartApp) -> None:
    url = await gateway(start_emulator, start_app, {"min_confidence": 1.0})
    with capture_logs() as logs:
        headers, _ = await stream(url, UNSURE)
    assert headers["x-gateway-tier"] == "small" and request_line(logs)["escalation"] is None


async def test_the_least_token_measure_decides_where_the_mean_would_not(start_emulator: StartEmulator,
                                                                       start_app: StartApp) -> None:
    # SURE: geometric mean ~0.93, least likely token ~0.87: 0.9 escalates it only by its least likely token
    url = await gateway(start_emulator, start_app, {"min_confidence": 0.9, "measure": "least_token"})
    _, headers, _ = await ask(url, SURE)
    assert headers["x-gateway-escalated-from"] == "small"
    url = await gateway(start_emulator, start_app, {"min_confidence": 0.9})
    _, headers, _ = await ask(url, SURE)
    assert "x-gateway-escalated-from" not in headers


async def test_a_client_gone_during_the_hold_leaves_nothing_held(start_emulator: StartEmulator,
                                                                 start_app: StartApp) -> None:
    small, large = await start_emulator("fp16", seed=1), await start_emulator("instant", seed=2)  # ~30 ms a token
    app = create_app(config(small.url, large.url, {"min_confidence": MIN_CONFIDENCE, "hold_tokens": 16}))
    APPS[:] = [app]
    url = await start_app(app)
    body = {"model": "auto", "messages": [{"role": "user", "content": SURE}], "max_tokens": 32, "stream": True}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.25):  # inside the hold: no byte sent yet
                    async with session.post(f"{url}/v1/chat/completions", json=body,
                                            headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as response:
                        await response.read()
        for _ in range(50):
            if any(entry.get("event") == "request" for entry in logs):
                break
            await asyncio.sleep(0.05)
    line = request_line(logs)
    assert line["outcome"] == "client_disconnected" and line["tier"] == "small"
    assert line["completion_tokens"] > 0 and line["cost_usd"] > 0  # what it generated in the hold, priced
    nothing_held()
