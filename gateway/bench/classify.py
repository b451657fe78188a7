"""The cost of difficulty classification in the gateway (bench/classify_throughput.py): throughput,
added latency and gateway CPU with classification off, on for new prompts (cold) and on for prompts
seen before (warm); the routed tenant routes by the rubric bands, or by predicted quality (`quality_floor`).
See the script for the setup."""

from __future__ import annotations

import contextlib
import collections
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import redis
import uvloop
import yaml

from gateway.bench.client import send_json
from gateway.bench.configs import policy_yaml, routes_yaml
from gateway.bench.cpu import Log, OtherWork
from gateway.bench.phases import Budget, Phase, json_phase, json_session, merge_phases, phase_summary
from gateway.bench.procs import RunStart, workdir
from gateway.bench.readers import commandstats, diff_counts, log_events, log_lines, redis_ops
from gateway.bench.stack import start_stack
from gateway.bench.summary import percentile
from gateway.bench.workload import sharegpt_prompts
from gateway.local.redis_server import EmbeddedRedis

PLAIN_KEY = "sk-demo"
ROUTED_KEY = "sk-bench-routed"
TIERS = ("small-int4", "medium-int8", "large-fp16")
EXAMPLE_POLICY = Path(__file__).resolve().parents[2] / "policies" / "example.yaml"
VLLM_ROUTES = Path(__file__).resolve().parents[2] / "routes" / "production-vllm.yaml"
MODES = ("OFF", "ON cold", "ON warm")


def shipped_cuts() -> list[float]:
    """The band cuts of policies/example.yaml (calibrated on the shipped classifier): the default."""
    bands = yaml.safe_load(EXAMPLE_POLICY.read_text())["routing"]["bands"]
    return [float(band["below"]) for band in bands if "below" in band]


def bands_of(cuts: list[float]) -> list[dict[str, Any]]:
    """Three bands over TIERS from two cuts."""
    if len(cuts) != len(TIERS) - 1 or sorted(cuts) != cuts:
        raise ValueError(f"give {len(TIERS) - 1} increasing cuts, got {cuts}")
    return [*({"below": cut, "tier": tier} for cut, tier in zip(cuts, TIERS, strict=False)), {"tier": TIERS[-1]}]


def vllm_quality_models() -> dict[str, str]:
    """TIERS -> the quality_model routes/production-vllm.yaml names for the tier of that name (the ladder's rungs
    8B < 49B < 51B)."""
    tiers = {t["name"]: t for t in yaml.safe_load(VLLM_ROUTES.read_text())["tiers"]}
    missing = [name for name in TIERS if not tiers.get(name, {}).get("quality_model")]
    if missing:
        raise ValueError(f"{VLLM_ROUTES}: no quality_model for tier(s) {missing}")
    return {name: str(tiers[name]["quality_model"]) for name in TIERS}


def routed_tenant(clf: Path, bands: list[dict[str, Any]], quality_floor: float | None) -> dict[str, Any]:
    """The routed tenant: the bands over TIERS, and with `quality_floor` that floor too (as policies/local.yaml
    serves its tenants: quality first, the bands when the predictor is missing or fails)."""
    tenant: dict[str, Any] = {"name": "routed", "key": ROUTED_KEY, "routing": {"classifier": str(clf), "bands": bands}}
    if quality_floor is not None:
        tenant["quality_floor"] = quality_floor
    return tenant


def route_kind(reason: object) -> str:
    """A request log line's route_reason by kind: `quality`, `band`, `default tier` (the text before the first
    colon), `-` when absent."""
    return str(reason).split(":", 1)[0] if reason else "-"


def expected_route(mode: str, by_quality: bool) -> str:
    """The route kind every request of `mode` must log: a run whose ON phases took another route measured
    something else than it says."""
    if mode == "OFF":
        return "default tier"
    return "quality" if by_quality else "band"


@dataclass(frozen=True)
class Settings:
    concurrency: int
    per_round: int  # distinct prompts per round (OFF, cold and warm each send all of them)
    rounds: int
    warmup: int  # requests per tenant before measuring (their own prompts)
    c1_requests: int  # prompts for the concurrency-1 points
    max_chars: int  # longest ShareGPT prompt used
    phase_limit_s: float
    budget_s: float


FULL = Settings(concurrency=16, per_round=400, rounds=2, warmup=48, c1_requests=150, max_chars=8000,
                phase_limit_s=40.0, budget_s=170.0)
QUICK = Settings(concurrency=16, per_round=150, rounds=2, warmup=32, c1_requests=60, max_chars=8000,
                 phase_limit_s=20.0, budget_s=90.0)


def chat(prompt: str) -> bytes:
    return orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1})


class Bench:
    def __init__(self, s: Settings, session: aiohttp.ClientSession, gw_port: int, gw_pid: int, redis: Any,
                 log: Log, request_log: Path) -> None:
        self.s, self.session, self.log, self.redis = s, session, log, redis
        self.gw_port, self.gw_pid, self.request_log = gw_port, gw_pid, request_log
        self.url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        self.keys = {"OFF": PLAIN_KEY, "ON cold": ROUTED_KEY, "ON warm": ROUTED_KEY}
        self.budget = Budget(s.budget_s, s.phase_limit_s)

    def headers(self, mode: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[mode]}", "Content-Type": "application/json"}

    async def phase(self, mode: str, prompts: list[str], c: int) -> Phase:
        limit = self.budget.limit()
        before = commandstats(self.redis) if self.redis is not None else {}
        ops0 = redis_ops(self.gw_port)
        ph = await json_phase(self.session, self.url, self.headers(mode), [chat(p) for p in prompts], c, limit,
                              mode, self.gw_pid)
        ops = redis_ops(self.gw_port).minus(ops0)
        ph.extra["redis_calls"], ph.extra["redis_failed"] = ops.calls(), ops.failed
        if self.redis is not None:
            cmds = diff_counts(commandstats(self.redis), before)
            cmds.pop("info", None)
            ph.extra["redis_commands"] = cmds
        return ph

    async def run(self, rounds: list[list[str]], c1: list[str], warm: list[str]) -> dict[str, Any]:
        s = self.s
        half = len(warm) // 2
        await self.phase("OFF", warm[:half], s.concurrency)  # warm-up: connections, ONNX session, code paths
        await self.phase("ON cold", warm[half:], s.concurrency)
        await self.phase("ON warm", warm[half:], s.concurrency)
        phases: dict[tuple[str, int], list[Phase]] = collections.defaultdict(list)
        self.log(f"concurrency {s.concurrency}, {len(rounds)} rounds of {len(rounds[0])} prompts:")
        for r, prompts in enumerate(rounds, 1):
            for mode in MODES:
                if self.budget.spent(f"round {r} {mode}"):
                    continue
                ph = await self.phase(mode, prompts, s.concurrency)
                phases[(mode, s.concurrency)].append(ph)
                sm = phase_summary(ph)
                self.log(f"  round {r} {mode:8s}: {sm['rps']:6.0f} req/s  p50 {sm['p50_ms']:7.2f} ms  "
                         f"p99 {sm['p99_ms']:7.2f} ms  gateway CPU {sm.get('gateway_cpu_us_per_req', 0):.0f} us/req"
                         f"{'  TRUNCATED' if ph.truncated else ''}"
                         f"{'  errors ' + str(sm['errors']) if sm['errors'] else ''}")
        self.log("concurrency 1:")
        for mode in MODES:
            if self.budget.spent(f"c=1 {mode}"):
                continue
            ph = await self.phase(mode, c1, 1)
            phases[(mode, 1)].append(ph)
            sm = phase_summary(ph)
            self.log(f"  {mode:8s}: p50 {sm['p50_ms']:7.2f} ms  p99 {sm['p99_ms']:7.2f} ms")
        ids = {x.headers["x-request-id"] for parts in phases.values() for p in parts for x in p.samples
               if "x-request-id" in x.headers}
        lines = log_lines(self.request_log, ids)
        self.log(f"request log: {len(lines)} of {len(ids)} measured requests found")
        return {"rows": [row_of(mode, c, parts, lines) for (mode, c), parts in phases.items()],
                "skipped": self.budget.skipped}


def row_of(mode: str, c: int, parts: list[Phase], lines: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One table row from its rounds; `lines`: the gateway's request log lines by request id (the route taken,
    the predicted qualities)."""
    merged = merge_phases(parts)
    row = phase_summary(merged)
    row["mode"] = mode
    row["rounds"] = [{k: v for k, v in phase_summary(p).items() if k in ("rps", "p50_ms", "p99_ms", "n")} for p in parts]
    row["tiers"] = dict(collections.Counter(str(x.tier) for x in merged.samples))
    logged = [lines.get(x.headers.get("x-request-id", "")) for x in merged.samples]
    row["routes"] = dict(collections.Counter("not logged" if ln is None else route_kind(ln.get("route_reason"))
                                             for ln in logged))
    row["quality_predicted"] = sum(1 for ln in logged if ln is not None and ln.get("quality"))
    diffs = [x.difficulty for x in merged.samples if x.difficulty is not None]
    row["classified"] = len(diffs) + row["quality_predicted"]
    row["difficulty_p10_p50_p90"] = [round(percentile(diffs, q), 3) for q in (10, 50, 90)] if diffs else None
    cmds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    for p in parts:
        cmds.update(p.extra.get("redis_commands", {}))
        calls.update(p.extra.get("redis_calls", {}))
        failed.update(p.extra.get("redis_failed", {}))
    row["redis_commands"], row["redis_calls"], row["redis_failed"] = dict(cmds), dict(calls), dict(failed)
    return row


async def run_all(s: Settings, gw_port: int, gw_pid: int, redis: Any, pids: list[int], log: Log, request_log: Path,
                  by_quality: bool = False) -> dict[str, Any]:
    need = s.rounds * s.per_round + s.c1_requests + 2 * s.warmup
    pool = sharegpt_prompts(need, distinct=True, max_chars=s.max_chars)
    if len(pool) < need:
        raise RuntimeError(f"only {len(pool)} distinct ShareGPT prompts, need {need}")
    warm, rest = pool[: 2 * s.warmup], pool[2 * s.warmup:]
    rounds = [rest[i * s.per_round:(i + 1) * s.per_round] for i in range(s.rounds)]
    c1 = rest[s.rounds * s.per_round:][: s.c1_requests]
    chars = [len(p) for p in pool]
    log(f"{len(pool)} distinct ShareGPT first-turn prompts (<= {s.max_chars} chars): mean {np.mean(chars):.0f} "
        f"chars, p50 {percentile(chars, 50):.0f}, p90 {percentile(chars, 90):.0f}")
    async with json_session() as session:
        b = Bench(s, session, gw_port, gw_pid, redis, log, request_log)
        smoke = await send_json(session, b.url, chat("smoke test: how are you?"), b.headers("ON cold"))
        rid = smoke.headers.get("x-request-id", "")
        reason = log_lines(request_log, {rid}).get(rid, {}).get("route_reason") if smoke.ok and rid else None
        if not smoke.ok or route_kind(reason) != expected_route("ON cold", by_quality) or (
                not by_quality and smoke.difficulty is None):
            raise RuntimeError(f"smoke test failed (an ON request must route by "
                               f"{expected_route('ON cold', by_quality)}; the log says {reason!r}): {smoke}")
        log(f"smoke test ok: -> tier {smoke.tier} ({reason})")
        other = OtherWork(pids)
        with other.phase("measurement", log):
            out = await b.run(rounds, c1, warm)
    return {"throughput": out, "other_work": other.phases,
            "prompt_chars": {"mean": float(np.mean(chars)), "p50": percentile(chars, 50),
                             "p90": percentile(chars, 90)}}


def run(s: Settings, clf: Path, use_redis: bool, start: RunStart, log: Log,
        bands: list[dict[str, Any]], quality_floor: float | None = None) -> dict[str, Any]:
    """Redis (unless not `use_redis`), the emulator and the gateway with classifier `clf` routing by `bands`, or
    with `quality_floor` by predicted quality (the tiers get the vLLM routes' quality_model, the bands stay as
    the fallback); the measurements; stops them all."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(EmbeddedRedis()) if use_redis else None
        tmp = stack.enter_context(workdir(start.procs, "bench-classify-"))
        client = redis.Redis.from_url(server.url) if server is not None else None
        if client is not None:
            stack.callback(client.close)
        policy = policy_yaml(TIERS[0], [{"name": "plain", "key": PLAIN_KEY}, routed_tenant(clf, bands, quality_floor)],
                             max_tokens=1)
        quality_models = vllm_quality_models() if quality_floor is not None else None
        gw = start_stack(start.procs, tmp, lambda urls: routes_yaml({t: [(f"{t}-a", urls[0])] for t in TIERS},
                                                                    quality_models=quality_models),
                         policy, redis_url=server.url if server else None, gw_cpu=start.gw_cpu, gateway_timeout_s=90)
        gw_affinity = sorted(os.sched_getaffinity(gw.gateway_pid))
        startup = (tmp / "gateway.out").read_text(errors="replace")
        provider = next((ln for ln in startup.splitlines() if ln.startswith("classifier ")), "?")
        predictor = next((ln for ln in startup.splitlines() if ln.startswith("quality predictor ")), None)
        log(f"gateway pid {gw.gateway_pid} on CPUs {gw_affinity}; {provider}"
            + (f"; {predictor}" if predictor else ""))
        if quality_floor is not None and (predictor is None or " not loaded " in predictor):
            raise RuntimeError(f"quality_floor {quality_floor}: the gateway has no quality predictor ({predictor})")
        pids = [os.getpid(), *gw.emulator_pids, gw.gateway_pid]
        if server is not None and server.process is not None:
            pids.append(server.process.pid)
        result = uvloop.run(run_all(s, gw.gateway_port, gw.gateway_pid, client, pids, log, gw.request_log,
                                    quality_floor is not None))
        start.procs.check_alive()
        result["gateway_log"] = log_events(gw.request_log)
        result["gateway_cpus"] = gw_affinity
        result["classifier_line"] = provider
        result["predictor_line"] = predictor
        result["quality_floor"] = quality_floor
        result["quality_models"] = quality_models
        result["route_mismatches"] = route_mismatches(result["throughput"]["rows"], quality_floor is not None)
    return result


def route_mismatches(rows: list[dict[str, Any]], by_quality: bool) -> list[str]:
    """One line per row whose requests did not all log the route its mode must take (expected_route)."""
    out = []
    for row in rows:
        want = expected_route(row["mode"], by_quality)
        other = {k: v for k, v in row.get("routes", {}).items() if k != want}
        if other:
            out.append(f"{row['mode']} c={row['concurrency']}: {other} of {row['n']} did not route by {want}")
    return out
