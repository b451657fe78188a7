"""Redis memory per cached response: write N response-cache entries, as the gateway stores them (its
key function, its record encoding, SET with a TTL), into a fresh embedded Redis 8 and read INFO memory.

    .venv/bin/python bench/redis_memory.py --entries 100000 --answer-chars 1200

Prints used_memory before and after, bytes per entry and the extrapolation to 1M entries. Entries are
distinct chat requests (a ~300-character prompt each) whose answers have `--answer-chars` characters.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import string

import redis.asyncio as aioredis

from gateway.cache.answers import CachedAnswer
from gateway.cache.keys import response_key
from gateway.reading import read
from gateway.local.redis_server import EmbeddedRedis

BATCH = 1000


def entry(index: int, answer_chars: int, rng: random.Random) -> tuple[str, bytes]:
    """The key and value the gateway would store for the `index`-th distinct deterministic request."""
    prompt = f"Question {index}: " + " ".join(rng.choice(WORDS) for _ in range(45))
    body = {"model": "small-int4", "temperature": 0, "max_tokens": 512,
            "messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": prompt}]}
    text = "".join(rng.choice(LETTERS) for _ in range(answer_chars))
    answer = CachedAnswer(text, "stop", 80, answer_chars // 4, "llama-3.1-8b-awq")
    reading = read("chat", body)
    reading.limit(512, ())
    return response_key("tenant-a", "small-int4", reading), answer.to_bytes()


WORDS = ["latency", "replica", "budget", "prefix", "stream", "token", "gateway", "cluster", "policy", "cache"]
LETTERS = string.ascii_letters + "      .,"


async def fill(url: str, entries: int, answer_chars: int, ttl_s: int) -> int:
    """Write the entries; returns the mean value size in bytes."""
    client = aioredis.Redis.from_url(url)
    rng, value_bytes = random.Random(0), 0
    try:
        for start in range(0, entries, BATCH):
            async with client.pipeline(transaction=False) as pipe:
                for index in range(start, min(start + BATCH, entries)):
                    key, value = entry(index, answer_chars, rng)
                    value_bytes += len(value)
                    pipe.set(key, value, ex=ttl_s)
                await pipe.execute()
    finally:
        await client.aclose()
    return value_bytes // entries


async def used_memory(url: str) -> tuple[int, int]:
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("memory")
        keys = await client.dbsize()
    finally:
        await client.aclose()
    return int(info["used_memory"]), int(keys)


async def measure(url: str, entries: int, answer_chars: int) -> None:
    before, _ = await used_memory(url)
    value = await fill(url, entries, answer_chars, ttl_s=3600)
    after, keys = await used_memory(url)
    per_entry = (after - before) / entries
    print(f"entries {entries} (keys in Redis: {keys}), answer {answer_chars} chars, stored value {value} bytes")
    print(f"used_memory before {before} B, after {after} B")
    print(f"per entry {per_entry:.0f} B (value {value} B + key and Redis overhead {per_entry - value:.0f} B)")
    print(f"1M entries: {per_entry * 1e6 / 2**30:.2f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--answer-chars", type=int, default=1200, help="characters of each cached answer")
    parser.add_argument("--redis-url", help="measure this (empty) Redis instead of a fresh embedded one")
    args = parser.parse_args()
    if args.redis_url:
        asyncio.run(measure(args.redis_url, args.entries, args.answer_chars))
        return
    with EmbeddedRedis() as server:
        asyncio.run(measure(server.url, args.entries, args.answer_chars))


if __name__ == "__main__":
    main()
