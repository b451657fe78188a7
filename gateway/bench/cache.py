"""The exact response cache against Redis (bench/cache_bench.py): hit latency, Redis commands and round
trips per request, hit ratio on ShareGPT streams with repeats. See the script for what each part measures."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import redis
import uvloop

from gateway.bench.client import send_json
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import Log, OtherWork
from gateway.bench.phases import Budget, Phase, json_phase, json_session, merge_phases, phase_summary
from gateway.bench.procs import RunStart, workdir
from gateway.bench.readers import commandstats, diff_counts, log_events, redis_ops, wait_quiet
from gateway.bench.stack import start_stack
from gateway.bench.workload import sharegpt_prompts
from gateway.local.redis_server import EmbeddedRedis

API_KEY = "sk-demo"
METERED_KEY = "sk-bench-metered"
TARGET_HIT_P99_MS = 2.0
FILLER = ("Answer briefly and precisely; this request is part of a cache benchmark of the gateway, "
          "which replays deterministic answers from Redis when the same request comes again.")


@dataclass(frozen=True)
class Settings:
    hot_prompts: int  # N distinct prompts stored before the hit measurement
    c32_requests: int  # measured requests per path at concurrency 32 (split over `rounds`)
    c32_warmup: int
    c1_requests: int
    rounds: int
    max_tokens: int
    rt_batch: int  # requests per round-trip batch (misses, then the same as hits)
    rt_concurrency: int
    rt_attempts: int
    zipf_s: float
    zipf_distinct: int  # M
    zipf_requests: int
    natural_requests: int
    ratio_concurrency: int
    phase_limit_s: float  # time limit of any one closed-loop run
    budget_s: float  # the whole run: later phases shrink or are skipped past it


FULL = Settings(hot_prompts=512, c32_requests=2000, c32_warmup=200, c1_requests=300, rounds=2, max_tokens=16,
                rt_batch=100, rt_concurrency=1, rt_attempts=3, zipf_s=1.1, zipf_distinct=1000, zipf_requests=3000,
                natural_requests=3000, ratio_concurrency=16, phase_limit_s=30.0, budget_s=160.0)
QUICK = Settings(hot_prompts=256, c32_requests=600, c32_warmup=100, c1_requests=100, rounds=2, max_tokens=16,
                 rt_batch=100, rt_concurrency=1, rt_attempts=3, zipf_s=1.1, zipf_distinct=300, zipf_requests=800,
                 natural_requests=800, ratio_concurrency=16, phase_limit_s=15.0, budget_s=80.0)


def chat(model: str, prompt: str, max_tokens: int) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                         "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


def synthetic(tag: str, i: int) -> str:
    return f"[{tag} #{i}] {FILLER}"  # ~185 characters: 2 complete prefix-affinity blocks of 64


class Bench:
    def __init__(self, s: Settings, session: aiohttp.ClientSession, gw_port: int, emu_port: int, gw_pid: int,
                 redis: Any, gw_log: Path, log: Log) -> None:
        self.s, self.session, self.log, self.gw_log = s, session, log, gw_log
        self.gw_port, self.gw_pid, self.redis = gw_port, gw_pid, redis
        self.gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        self.emu_url = f"http://127.0.0.1:{emu_port}/v1/chat/completions"
        self.demo = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        self.metered = {"Authorization": f"Bearer {METERED_KEY}", "Content-Type": "application/json"}
        self.plain = {"Content-Type": "application/json"}
        self.budget = Budget(s.budget_s, s.phase_limit_s, log)

    async def run(self, url: str, headers: dict[str, str], bodies: list[bytes], c: int, name: str,
                  cpu: bool = True) -> Phase:
        """One closed-loop run; for gateway runs (`cpu`) also what the gateway's Redis guard saw meanwhile."""
        if not cpu:
            return await json_phase(self.session, url, headers, bodies, c, self.budget.limit(), name)
        ph_up = await self.wait_up()
        ops0, down0 = redis_ops(self.gw_port), self.down_episodes()
        ph = await json_phase(self.session, url, headers, bodies, c, self.budget.limit(), name, self.gw_pid)
        ops = redis_ops(self.gw_port).minus(ops0)
        ph.extra["redis_up_at_start"] = ph_up
        ph.extra["redis_calls"] = ops.calls()
        ph.extra["redis_failed"] = ops.failed
        # every request here is cacheable: a lookup the guard did not send was skipped (Redis held down)
        ph.extra["lookups_skipped"] = len(ph.samples) - ops.calls().get("cache_get", 0)
        ph.extra["redis_down_episodes"] = self.down_episodes() - down0
        get = ops.buckets.get("cache_get", {})
        if get.get("+Inf"):
            ph.extra["cache_get_within_ms"] = {f"{float(le) * 1e3:g}": v / get["+Inf"] for le, v in get.items()
                                               if le != "+Inf"}
        return ph

    async def wait_up(self, limit_s: float = 5.0) -> bool:
        """Until the gateway's gateway_redis_up gauge reads 1: after a timeout streak the guard skips Redis
        for 1 s, then the next call probes it. Sends a throw-away cacheable request every 0.3 s (bounded)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if redis_ops(self.gw_port).up != 0:
                return True
            await asyncio.sleep(0.3)
            await send_json(self.session, self.gw_url, chat("solo", f"probe {time.time()}", 1), self.demo)
        return False

    def down_episodes(self) -> int:
        """How often the gateway marked Redis down and back up (its `redis_recovered` log events)."""
        return int(log_events(self.gw_log)["events"].get("redis_recovered", 0))

    async def store_all(self, bodies: list[bytes], what: str) -> int:
        """Send `bodies` one at a time until each answer is in Redis (at most 3 passes); returns stored keys."""
        stored = 0
        for attempt in range(3):
            await self.run(self.gw_url, self.demo, bodies, 1, what)
            self.settle()
            stored = sum(1 for _ in self.redis.scan_iter(match="resp:*", count=1000))
            if stored >= len(bodies):
                break
        return stored

    def settle(self) -> None:
        """Wait for the gateway's background Redis writes to finish (commandstats stops moving)."""
        wait_quiet(lambda: sum(commandstats(self.redis).values()), settle_s=0.3, limit_s=5.0)

    # ----------------------------------------------------------------------- 1. latency

    async def latency(self) -> dict[str, Any]:
        s = self.s
        hot = [chat("solo", synthetic("hot", i), s.max_tokens) for i in range(s.hot_prompts)]
        self.redis.flushdb()
        stored = await self.store_all(hot, "store hot prompts")
        self.log(f"stored {stored} answers in Redis for {len(hot)} hot prompts (sent at c=1)")
        counter = iter(range(10**9))

        def misses(n: int) -> list[bytes]:
            return [chat("solo", synthetic("miss", next(counter)), s.max_tokens) for _ in range(n)]

        rng = random.Random(1)

        def hits(n: int) -> list[bytes]:
            order = list(range(len(hot)))
            out: list[bytes] = []
            while len(out) < n:
                rng.shuffle(order)
                out += [hot[i] for i in order]
            return out[:n]

        def direct(n: int) -> list[bytes]:
            return [chat("emulated", synthetic("direct", next(counter)), s.max_tokens) for _ in range(n)]

        paths = {
            "direct": (self.emu_url, self.plain, direct),
            "gateway miss": (self.gw_url, self.demo, misses),
            "gateway hit": (self.gw_url, self.demo, hits),
        }
        phases: dict[tuple[str, int], list[Phase]] = collections.defaultdict(list)
        self.log("latency at concurrency 1:")
        for name, (url, headers, make) in paths.items():
            await self.run(url, headers, make(30), 1, "warm-up", cpu=False)
            ph = await self.run(url, headers, make(s.c1_requests), 1, name, cpu=name != "direct")
            phases[(name, 1)].append(ph)
            self.log(f"  {name:13s} c=1:  p50 {phase_summary(ph)['p50_ms']:.2f} ms")
        self.log(f"latency at concurrency 32 ({s.rounds} interleaved rounds):")
        per_round = max(1, s.c32_requests // s.rounds)
        for r in range(s.rounds):
            for name, (url, headers, make) in paths.items():
                if self.budget.spent(f"latency c=32 round {r + 1} {name}"):
                    continue
                await self.run(url, headers, make(s.c32_warmup if r == 0 else s.c32_warmup // 4), 32, "warm-up",
                               cpu=False)
                ph = await self.run(url, headers, make(per_round), 32, name, cpu=name != "direct")
                phases[(name, 32)].append(ph)
                sm = phase_summary(ph)
                self.log(f"  round {r + 1} {name:13s} c=32: {sm['rps']:.0f} req/s p50 {sm['p50_ms']:.2f} ms "
                         f"p99 {sm['p99_ms']:.2f} ms")
        rows = []
        for (name, c), parts in phases.items():
            merged = merge_phases(parts)
            only = None
            if name == "gateway hit":
                only = [x for x in merged.samples if x.cache == "hit"]
                every = phase_summary(merged)
            row = phase_summary(merged, only)
            row["path"] = name
            row["sent"] = len(merged.samples)
            row["cache_headers"] = dict(collections.Counter(str(x.cache) for x in merged.samples))
            if name == "gateway hit":
                row["all_responses"] = {k: every[k] for k in ("p50_ms", "p90_ms", "p99_ms", "n")}
            if name != "direct":
                calls: collections.Counter[str] = collections.Counter()
                failed: collections.Counter[str] = collections.Counter()
                for p in parts:
                    calls.update(p.extra.get("redis_calls", {}))
                    failed.update(p.extra.get("redis_failed", {}))
                row["redis_calls"], row["redis_failed"] = dict(calls), dict(failed)
                row["redis_down_episodes"] = sum(p.extra.get("redis_down_episodes", 0) for p in parts)
                row["lookups_skipped"] = sum(p.extra.get("lookups_skipped", 0) for p in parts)
                row["redis_up_at_start"] = [p.extra.get("redis_up_at_start") for p in parts]
                row["cache_get_within_ms"] = [p.extra.get("cache_get_within_ms") for p in parts]
            rows.append(row)
        return {"stored_hot": stored, "rows": rows}

    # ----------------------------------------------------------------------- 2. round trips

    async def round_trips(self) -> list[dict[str, Any]]:
        """Per config: a batch of new prompts (pure misses), then the same batch again (pure hits). A timeout
        or a skipped lookup pollutes the counts (a skipped miss stores nothing, so its repeat misses too):
        such an attempt is retried with new prompts, up to `rt_attempts`; the cleanest attempt is kept."""
        s = self.s
        out = []
        configs = [("demo: cache only, 1-replica tier", self.demo, "solo"),
                   ("metered: + rate limits, daily budget, 2-replica tier", self.metered, "pair")]
        for label, headers, tier in configs:
            warm = [chat(tier, synthetic(tier + "-rt-warm", i), s.max_tokens) for i in range(10)]
            await self.run(self.gw_url, headers, warm, 2, "warm-up", cpu=False)  # loads the Lua script
            self.settle()
            best: dict[str, Any] | None = None
            for attempt in range(1, s.rt_attempts + 1):
                if self.budget.spent(f"round trips {label} attempt {attempt}"):
                    break
                batch = [chat(tier, synthetic(f"{tier}-rt{attempt}", i), s.max_tokens) for i in range(s.rt_batch)]
                result: dict[str, Any] = {"config": label, "tier": tier, "batch": len(batch), "attempt": attempt}
                for kind in ("miss", "hit"):
                    result[kind] = await self.rt_batch(headers, batch)
                    self.log(f"  {label} attempt {attempt} {kind}: commands/req " + ", ".join(
                        f"{k} {v:.2f}" for k, v in result[kind]["commands_per_request"].items()) +
                        "; round trips/req " + ", ".join(
                        f"{k} {v:.2f}" for k, v in result[kind]["round_trips_per_request"].items()) +
                        f"; {result[kind]['cache_headers']}, timed out {result[kind]['failed_per_request']}, "
                        f"skipped {result[kind]['lookups_skipped']:.0f}")
                result["disturbed"] = sum(sum(result[k]["failed_per_request"].values()) * result[k]["n"]
                                          + result[k]["lookups_skipped"] for k in ("miss", "hit"))
                if best is None or result["disturbed"] < best["disturbed"]:
                    best = result
                if not result["disturbed"]:
                    break
            if best is not None:
                best["attempts"] = attempt
                out.append(best)
        return out

    async def rt_batch(self, headers: dict[str, str], batch: list[bytes]) -> dict[str, Any]:
        await self.wait_up()
        c0, o0, d0 = commandstats(self.redis), redis_ops(self.gw_port), self.down_episodes()
        ph = await json_phase(self.session, self.gw_url, headers, batch, self.s.rt_concurrency, self.budget.limit(),
                              "round-trip batch")
        self.settle()
        c1, ops = commandstats(self.redis), redis_ops(self.gw_port).minus(o0)
        cmds = diff_counts(c1, c0)
        cmds.pop("info", None)  # this script's own INFO calls
        n = len(ph.samples)
        return {
            "n": n, "errors": sum(not x.ok for x in ph.samples),
            "cache_headers": dict(collections.Counter(str(x.cache) for x in ph.samples)),
            "commands_total": cmds, "commands_per_request": {k: v / n for k, v in cmds.items()},
            "round_trips_per_request": {k: v / n for k, v in ops.calls().items()},
            "failed_per_request": {k: v / n for k, v in ops.failed.items()},
            "lookups_skipped": n - ops.calls().get("cache_get", 0),
            "redis_down_episodes": self.down_episodes() - d0,
        }

    # ----------------------------------------------------------------------- 3. hit ratio

    async def hit_ratio(self) -> list[dict[str, Any]]:
        s = self.s
        distinct = sharegpt_prompts(s.zipf_distinct, distinct=True)
        rng = np.random.default_rng(7)
        weights = 1.0 / np.arange(1, len(distinct) + 1) ** s.zipf_s
        ranks = rng.permutation(len(distinct))  # which prompt has which popularity rank
        draws = rng.choice(len(distinct), size=s.zipf_requests, p=weights / weights.sum())
        zipf = [distinct[ranks[d]] for d in draws]
        natural = sharegpt_prompts(s.natural_requests, distinct=False)
        streams = [
            (f"Zipf s={s.zipf_s} over M={len(distinct)} distinct prompts", zipf, 1),
            (f"Zipf s={s.zipf_s} over M={len(distinct)} distinct prompts", zipf, s.ratio_concurrency),
            ("ShareGPT first turns in dataset order (natural repeats)", natural, s.ratio_concurrency),
        ]
        out = []
        for label, prompts, c in streams:
            if self.budget.spent(f"hit ratio {label} c={c}"):
                continue
            self.redis.flushdb()
            bodies = [chat("solo", p, s.max_tokens) for p in prompts]
            ph = await self.run(self.gw_url, self.demo, bodies, c, label)
            sent = sorted(ph.samples, key=lambda x: x.index)
            n = len(sent)
            texts = [prompts[x.index] for x in sent]
            ideal_distinct = len({" ".join(t.split()) for t in texts})
            exact_distinct = len(set(texts))
            first_seen: set[str] = set()
            repeat_misses = first_hits = 0
            for x, t in zip(sent, texts):
                if x.cache != "hit" and t in first_seen and x.ok:
                    repeat_misses += 1
                if x.cache == "hit" and t not in first_seen:
                    first_hits += 1
                first_seen.add(t)
            hits = sum(x.cache == "hit" for x in sent)
            row = {
                "stream": label, "concurrency": c, "requests": n, "distinct": exact_distinct,
                "distinct_normalized": ideal_distinct, "errors": sum(not x.ok for x in sent), "hits": hits,
                "observed_hit_ratio": hits / n if n else float("nan"),
                "ideal_hit_ratio": 1 - exact_distinct / n if n else float("nan"),
                "repeat_misses": repeat_misses, "hits_on_first_occurrence": first_hits,
                "truncated": ph.truncated, "rps": n / ph.wall_s if ph.wall_s else float("nan"),
                "mean_prompt_chars": float(np.mean([len(t) for t in texts])) if texts else 0.0,
                "redis_failed": ph.extra.get("redis_failed", {}),
                "redis_down_episodes": ph.extra.get("redis_down_episodes", 0),
                "lookups_skipped": ph.extra.get("lookups_skipped", 0),
                "cache_headers": dict(collections.Counter(str(x.cache) for x in sent)),
            }
            self.log(f"  {label} c={c}: {n} requests, hit ratio {row['observed_hit_ratio']:.3f} vs ideal "
                     f"{row['ideal_hit_ratio']:.3f}; {repeat_misses} repeats missed; Redis calls failed "
                     f"{row['redis_failed']}, marked down {row['redis_down_episodes']} times")
            out.append(row)
            self.settle()
        return out


# --------------------------------------------------------------------------- report


async def run_all(args: argparse.Namespace, s: Settings, gw_port: int, emu_port: int, gw_pid: int, redis: Any,
                  gw_log: Path, pids: list[int], log: Log) -> dict[str, Any]:
    other = OtherWork(pids)
    async with json_session() as session:
        b = Bench(s, session, gw_port, emu_port, gw_pid, redis, gw_log, log)
        smoke = await b.run(b.gw_url, b.demo, [chat("solo", "smoke test", s.max_tokens)] * 2, 1, "smoke", cpu=False)
        if not all(x.ok for x in smoke.samples) or smoke.samples[1].cache != "hit":
            # the second identical request may race the background SET: retry once after it settles
            b.settle()
            again = await b.run(b.gw_url, b.demo, [chat("solo", "smoke test", s.max_tokens)], 1, "smoke", cpu=False)
            if not again.samples[0].ok or again.samples[0].cache != "hit":
                raise RuntimeError(f"smoke test failed: {[asdict(x) for x in smoke.samples + again.samples]}")
        log("smoke test ok (miss, then hit)")
        result: dict[str, Any] = {}
        if args.only in (None, "latency"):
            with other.phase("latency", log):
                result["latency"] = await b.latency()
        if args.only in (None, "round-trips"):
            log("Redis per request:")
            with other.phase("round trips", log):
                result["round_trips"] = await b.round_trips()
        if args.only in (None, "hit-ratio"):
            log("hit ratio on ShareGPT streams:")
            with other.phase("hit ratio", log):
                result["hit_ratio"] = await b.hit_ratio()
        result["other_work"] = other.phases
        result["skipped"] = b.budget.skipped
        ops = redis_ops(gw_port)
        result["redis_ops_total"] = {k: f"{ops.ok.get(k, 0):.0f} + {ops.failed.get(k, 0):.0f}" for k in ops.calls()}
        return result


def run(args: argparse.Namespace, s: Settings, start: RunStart, log: Log) -> dict[str, Any]:
    """Redis, the emulator and the gateway (Redis on the gateway), the parts asked for; stops them all."""
    def tiers(urls: Sequence[str]) -> str:
        return routes_yaml({"solo": [("solo-a", urls[0])], "pair": [("pair-a", urls[0]), ("pair-b", urls[0])]},
                           args.redis_op_timeout_ms)

    with EmbeddedRedis() as redis_server, workdir(start.procs, "bench-cache-") as tmp:
        policy = policy_yaml("solo", [
            {"name": "demo", "key": API_KEY},
            {"name": "metered", "key": METERED_KEY,
             "rate_limit": {"requests_per_min": 10_000_000, "tokens_per_min": 10_000_000_000},
             "daily_budget_usd": 1_000_000},
        ], max_tokens=s.max_tokens)
        stack = start_stack(start.procs, tmp, tiers, policy, redis_url=redis_server.url, gw_cpu=start.gw_cpu)
        client = redis.Redis.from_url(redis_server.url)
        pids = [os.getpid(), *stack.emulator_pids, stack.gateway_pid,
                redis_server.process.pid if redis_server.process else 0]
        result = uvloop.run(run_all(args, s, stack.gateway_port, stack.emulator_ports[0], stack.gateway_pid, client,
                                    stack.request_log, [p for p in pids if p], log))
        start.procs.check_alive()
        result["gateway_log"] = log_events(stack.request_log)
        client.close()
    return result
