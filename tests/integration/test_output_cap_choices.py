"""The tenant's output cap holds for every output (issue 37): `n`, and a completion's list of prompts, streamed
and not, against a small backend on loopback that answers each output as vLLM does (a stream's chunks carry one
choice each, by `index`, round robin; a whole answer lists every choice)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import GatewayConfig, PolicyConfig
from gateway.testing import TEST_API_KEY, gateway_config, sse_event, tier
from tests.conftest import StartApp, StartEmulator

AUTH = {"Authorization": f"Bearer {TEST_API_KEY}"}
WORD = "abcdefg "  # one token of 8 characters
CAP = {"tokens": 32, "chars": 200}


def lengths(outputs: int) -> list[int]:
    """Tokens each output would write unbounded: output i 10 + 3i (some under the 200-character cap, most over)."""
    return [10 + 3 * i for i in range(outputs)]


def choices_backend(*, honour_max_tokens: bool = True, word: str = WORD, token_delay_s: float = 0.0,
                    tokens: int | None = None, first_byte_delay_s: float = 0.0) -> web.Application:
    """A backend for /v1/chat/completions and /v1/completions honouring `n` and prompt lists: output `i` (vLLM's
    order: prompt by prompt, then n) is `lengths()[i]` tokens of `word` (or `tokens` each), cut at max_tokens
    when honoured; a stream's first event after `first_byte_delay_s`, and each token `token_delay_s` apart (a
    whole answer after all its tokens' time)."""

    def full(body: dict[str, Any]) -> list[int]:
        prompt = body.get("prompt")
        prompts = len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], (str, list)) else 1
        outputs = prompts * (body.get("n") or 1)
        return lengths(outputs) if tokens is None else [tokens] * outputs

    def plan(body: dict[str, Any]) -> list[int]:
        limit = body.get("max_tokens") if honour_max_tokens else None
        return [min(n, limit) if limit else n for n in full(body)]

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        plan_ = plan(body)
        unbounded = full(body)
        usage = {"prompt_tokens": 5, "completion_tokens": sum(plan_), "total_tokens": 5 + sum(plan_)}
        reasons = ["length" if n < f else "stop" for n, f in zip(plan_, unbounded, strict=True)]
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            await asyncio.sleep(token_delay_s * max(plan_))
            choices = [({"index": i, "message": {"role": "assistant", "content": word * n}} if chat
                        else {"index": i, "text": word * n}) | {"finish_reason": reasons[i], "logprobs": None}
                       for i, n in enumerate(plan_)]
            return web.json_response({"id": "x", "object": kind, "created": 1, "model": "m", "choices": choices,
                                      "usage": usage})
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        await asyncio.sleep(first_byte_delay_s)
        head = {"id": "x", "object": f"{kind}.chunk" if chat else kind, "created": 1, "model": "m"}
        if chat:
            for i in range(len(plan_)):
                await reply.write(sse_event({**head, "choices": [{"index": i, "delta": {"role": "assistant"},
                                                                  "finish_reason": None}]}))
        for k in range(max(plan_)):
            for i, n in enumerate(plan_):
                if k < n:
                    piece: dict[str, Any] = {"content": word} if chat else {}
                    choice = {"index": i, **({"delta": piece} if chat else {"text": word}),
                              "finish_reason": reasons[i] if k == n - 1 else None}
                    await reply.write(sse_event({**head, "choices": [choice]}))
            await asyncio.sleep(token_delay_s)
        await reply.write(sse_event({**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        return reply

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", handler)
    return app


def capped(base: GatewayConfig, **cap: Any) -> GatewayConfig:
    data = base.policy.model_dump()
    data["tenants"] = [{**data["tenants"][0], "output_cap": cap}]
    return GatewayConfig.build(base.routes, PolicyConfig.model_validate(data))


async def gateway_over(start_app: StartApp, backend: web.Application, **cap: Any) -> str:
    upstream = await start_app(backend)
    return await start_app(create_app(capped(gateway_config([tier("t", [f"{upstream}/v1"])]), **cap)))


async def post(url: str, path: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/{path}", json=body, headers=AUTH) as response:
            assert response.status == 200, await response.text()
            return await response.read()


def per_index(raw: bytes, chat: bool) -> tuple[dict[int, str], dict[int, list[str]], dict[int, int]]:
    """A stream's text, finish reasons and content chunks per choice index; asserts it ended with [DONE]."""
    events = [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    texts: dict[int, str] = defaultdict(str)
    finishes: dict[int, list[str]] = defaultdict(list)
    chunks: dict[int, int] = defaultdict(int)
    for event in events[:-1]:
        for choice in orjson.loads(event)["choices"]:
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if piece:
                texts[choice["index"]] += piece
                chunks[choice["index"]] += 1
            if choice.get("finish_reason"):
                finishes[choice["index"]].append(choice["finish_reason"])
    return texts, finishes, chunks


def expected(outputs: int, cap_chars: int = 200, max_tokens: int = 32) -> list[tuple[str, str]]:
    """Each output's (text, finish reason) under the cap: the backend stops at max_tokens, the gateway at 200 chars."""
    out = []
    for n in lengths(outputs):
        text = WORD * min(n, max_tokens)
        out.append((text[:cap_chars], "length" if len(text) > cap_chars or n > max_tokens else "stop"))
    return out


@pytest.mark.parametrize("path, body", [
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 16}),
    ("completions", {"prompt": [f"p{i}" for i in range(8)], "n": 16}),
])
async def test_every_streamed_choice_is_cut_at_the_cap_and_the_others_go_on(start_app: StartApp, path: str,
                                                                            body: dict[str, Any]) -> None:
    url = await gateway_over(start_app, choices_backend(), **CAP)
    chat = path.startswith("chat")
    with capture_logs() as logs:
        raw = await post(url, path, {"model": "t", "stream": True, "max_tokens": 1000, **body})
    outputs = 16 if chat else 128
    texts, finishes, _ = per_index(raw, chat)
    assert sorted(texts) == list(range(outputs))
    for index, (text, reason) in enumerate(expected(outputs)):
        assert (texts[index], finishes[index]) == (text, [reason]), index  # one finish each, "length" when cut
    assert sum(len(t) for t in texts.values()) <= outputs * CAP["chars"]
    line = next(e for e in logs if e["event"] == "request")
    assert (line["status"], line["outcome"], line["output_capped"]) == (200, "ok", True)
    assert line["completion_tokens"] == sum(min(n, 32) for n in lengths(outputs))  # the backend's usage
    assert line["priced_from"] == "backend_usage"


async def test_a_token_cap_holds_for_every_streamed_choice_of_a_backend_ignoring_max_tokens(
        start_app: StartApp) -> None:
    url = await gateway_over(start_app, choices_backend(honour_max_tokens=False, word="w "), tokens=5)
    with capture_logs() as logs:
        raw = await post(url, "chat/completions", {"model": "t", "stream": True, "n": 4,
                                                   "messages": [{"role": "user", "content": "x"}]})
    texts, finishes, chunks = per_index(raw, True)
    assert [chunks[i] for i in range(4)] == [5, 5, 5, 5]
    assert [texts[i] for i in range(4)] == ["w " * 5] * 4
    assert [finishes[i] for i in range(4)] == [["length"]] * 4  # each once: no second finish at the end
    line = next(e for e in logs if e["event"] == "request")
    assert line["output_capped"] and line["finish_reason"] == "length" and line["outcome"] == "ok"


@pytest.mark.parametrize("path, body", [
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 16}),
    ("completions", {"prompt": [f"p{i}" for i in range(8)], "n": 16}),
])
async def test_every_choice_of_a_whole_answer_is_cut_at_the_cap(start_app: StartApp, path: str,
                                                                body: dict[str, Any]) -> None:
    url = await gateway_over(start_app, choices_backend(), **CAP)
    chat = path.startswith("chat")
    with capture_logs() as logs:
        answer = orjson.loads(await post(url, path, {"model": "t", "max_tokens": 1000, **body}))
    outputs = 16 if chat else 128
    got = [((c["message"]["content"] if chat else c["text"]), c["finish_reason"]) for c in answer["choices"]]
    assert got == expected(outputs)
    completion = sum(min(n, 32) for n in lengths(outputs))
    assert answer["usage"]["completion_tokens"] == completion  # as the backend said: the tokens it wrote
    line = next(e for e in logs if e["event"] == "request")
    assert (line["output_capped"], line["completion_tokens"], line["priced_from"]) == (True, completion,
                                                                                     "backend_usage")


async def test_a_whole_answer_from_a_tier_serving_responses_natively_is_cut_at_the_cap(start_app: StartApp) -> None:
    from tests.integration.test_protocols import native_backend

    upstream = await start_app(native_backend([]))
    native = tier("n", [f"{upstream}/v1"]).model_copy(update={"native": ("responses",)})
    url = await start_app(create_app(capped(gateway_config([native]), chars=6)))
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/responses", json={"model": "n", "input": "Hi"}, headers=AUTH) as r:
                answer = orjson.loads(await r.read())
    assert answer["output"][0]["content"][0]["text"] == "native"  # "native answer" cut to 6 characters
    assert (answer["status"], answer["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    line = next(e for e in logs if e["event"] == "request")
    assert (line["output_capped"], line["finish_reason"], line["completion_tokens"]) == (True, "length", 2)


async def test_the_emulator_serving_n_streamed_has_each_choice_cut(start_emulator: StartEmulator,
                                                                   start_app: StartApp) -> None:
    emulator = await start_emulator("int4")  # real decode pacing: every choice is still decoding at its cap
    url = await start_app(create_app(capped(gateway_config([tier("t", [f"{emulator.url}/v1"])]), chars=40)))
    with capture_logs() as logs:
        raw = await post(url, "chat/completions", {"model": "t", "stream": True, "n": 4, "max_tokens": 400,
                                                   "ignore_eos": True, "messages": [{"role": "user", "content": "x"}]})
    texts, finishes, _ = per_index(raw, True)
    assert [len(texts[i]) for i in range(4)] == [40] * 4 and [finishes[i] for i in range(4)] == [["length"]] * 4
    line = next(e for e in logs if e["event"] == "request")
    assert (line["output_capped"], line["outcome"], line["priced_from"]) == (True, "ok", "counted")
    assert line["completion_tokens"] < 4 * 400  # every choice cut: the backend cancelled, its tokens counted
