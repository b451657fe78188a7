"""Cost of difficulty classification in the gateway (issue: classifier): throughput and added latency.

    .venv/bin/python bench/classify_throughput.py [--quick] [--classifier models/difficulty] [--no-pin]

Starts on 127.0.0.1 one backend emulator (`instant` profile: it answers at once, so the gateway is
the bottleneck), a Redis server this script controls, and the gateway (`gateway serve`) pinned with
`taskset` to one CPU of its own: its event loop and the classifier's single ONNX thread share that
core. Requests: non-streaming chat, `model: "auto"`, max_tokens 1, no temperature (so the response
cache is bypassed), one distinct ShareGPT first-turn prompt each. Two tenants of one policy:

- OFF: tenant `plain` has no `routing`: auto goes to the default tier, nothing is classified;
- ON:  tenant `routed` has `routing: {classifier: DIR, bands: [...]}` over three `instant` tiers.

In `rounds` interleaved rounds, each on a new slice of prompts, at fixed concurrency (closed loop, no
think time): OFF, then ON cold (prompts the gateway has never seen: every one is encoded), then ON
warm (the same prompts again: the embedding comes from the in-process LRU, or the shared store).
Then the same three at concurrency 1 (the latency of one request on an idle gateway). Reports
requests/s, p50/p99 latency, the p50/p99 added by classification (ON minus OFF), gateway CPU per
request, the tiers chosen and the difficulty spread (x-gateway-tier, x-gateway-difficulty), and the
Redis commands each phase caused (a shared embedding store would show as MGET/SET of emb: keys).
Every loop is bounded in count and time; the whole run takes ~1-2 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _load as L  # noqa: E402

from gateway.local.redis_server import EmbeddedRedis  # noqa: E402

PLAIN_KEY = "sk-demo"
ROUTED_KEY = "sk-bench-routed"
TIERS = ("small-int4", "medium-int8", "large-fp16")
BANDS = [{"below": 0.6, "tier": "small-int4"}, {"below": 0.85, "tier": "medium-int8"}, {"tier": "large-fp16"}]


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
                 log: Any) -> None:
        self.s, self.session, self.log, self.redis = s, session, log, redis
        self.gw_port, self.gw_pid = gw_port, gw_pid
        self.url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        self.keys = {"OFF": PLAIN_KEY, "ON cold": ROUTED_KEY, "ON warm": ROUTED_KEY}
        self.deadline = time.monotonic() + s.budget_s
        self.skipped: list[str] = []

    def headers(self, mode: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[mode]}", "Content-Type": "application/json"}

    async def phase(self, mode: str, prompts: list[str], c: int) -> L.Phase:
        limit = max(1.0, min(self.s.phase_limit_s, self.deadline - time.monotonic()))
        before = L.commandstats(self.redis) if self.redis is not None else {}
        ops0 = L.redis_ops(self.gw_port)
        ph = await L.closed_loop(self.session, self.url, self.headers(mode), [chat(p) for p in prompts], c, limit,
                                 mode, self.gw_pid)
        ops = L.redis_ops(self.gw_port).minus(ops0)
        ph.extra["redis_calls"], ph.extra["redis_failed"] = ops.calls(), ops.failed
        if self.redis is not None:
            cmds = L.diff_counts(L.commandstats(self.redis), before)  # type: ignore[arg-type]
            cmds.pop("info", None)
            ph.extra["redis_commands"] = cmds
        return ph

    async def run(self, rounds: list[list[str]], c1: list[str], warm: list[str]) -> dict[str, Any]:
        s = self.s
        half = len(warm) // 2
        await self.phase("OFF", warm[:half], s.concurrency)  # warm-up: connections, ONNX session, code paths
        await self.phase("ON cold", warm[half:], s.concurrency)
        await self.phase("ON warm", warm[half:], s.concurrency)
        phases: dict[tuple[str, int], list[L.Phase]] = collections.defaultdict(list)
        self.log(f"concurrency {s.concurrency}, {len(rounds)} rounds of {len(rounds[0])} prompts:")
        for r, prompts in enumerate(rounds, 1):
            for mode in ("OFF", "ON cold", "ON warm"):
                if time.monotonic() > self.deadline:
                    self.skipped.append(f"round {r} {mode}")
                    continue
                ph = await self.phase(mode, prompts, s.concurrency)
                phases[(mode, s.concurrency)].append(ph)
                sm = L.summarize(ph)
                self.log(f"  round {r} {mode:8s}: {sm['rps']:6.0f} req/s  p50 {sm['p50_ms']:7.2f} ms  "
                         f"p99 {sm['p99_ms']:7.2f} ms  gateway CPU {sm.get('gateway_cpu_us_per_req', 0):.0f} us/req"
                         f"{'  TRUNCATED' if ph.truncated else ''}"
                         f"{'  errors ' + str(sm['errors']) if sm['errors'] else ''}")
        self.log("concurrency 1:")
        for mode in ("OFF", "ON cold", "ON warm"):
            if time.monotonic() > self.deadline:
                self.skipped.append(f"c=1 {mode}")
                continue
            ph = await self.phase(mode, c1, 1)
            phases[(mode, 1)].append(ph)
            sm = L.summarize(ph)
            self.log(f"  {mode:8s}: p50 {sm['p50_ms']:7.2f} ms  p99 {sm['p99_ms']:7.2f} ms")
        return {"rows": [row_of(mode, c, parts) for (mode, c), parts in phases.items()], "skipped": self.skipped}


def row_of(mode: str, c: int, parts: list[L.Phase]) -> dict[str, Any]:
    merged = L.Phase(mode, [x for p in parts for x in p.samples], sum(p.wall_s for p in parts),
                     any(p.truncated for p in parts), c, sum(p.gateway_cpu_s or 0.0 for p in parts))
    row = L.summarize(merged)
    row["mode"] = mode
    row["rounds"] = [{k: v for k, v in L.summarize(p).items() if k in ("rps", "p50_ms", "p99_ms", "n")} for p in parts]
    row["tiers"] = dict(collections.Counter(str(x.tier) for x in merged.samples))
    diffs = [x.difficulty for x in merged.samples if x.difficulty is not None]
    row["classified"] = len(diffs)
    row["difficulty_p10_p50_p90"] = [round(L.pct(diffs, q), 3) for q in (10, 50, 90)] if diffs else None
    cmds: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    failed: collections.Counter[str] = collections.Counter()
    for p in parts:
        cmds.update(p.extra.get("redis_commands", {}))
        calls.update(p.extra.get("redis_calls", {}))
        failed.update(p.extra.get("redis_failed", {}))
    row["redis_commands"], row["redis_calls"], row["redis_failed"] = dict(cmds), dict(calls), dict(failed)
    return row


def render(result: dict[str, Any]) -> str:
    rows = result["throughput"]["rows"]
    by = {(r["mode"], r["concurrency"]): r for r in rows}
    table = []
    for (mode, c), r in sorted(by.items(), key=lambda kv: (-kv[0][1], ["OFF", "ON cold", "ON warm"].index(kv[0][0]))):
        off = by.get(("OFF", c))
        added = "-" if mode == "OFF" or off is None else (
            f"{r['p50_ms'] - off['p50_ms']:+.2f} / {r['p99_ms'] - off['p99_ms']:+.2f}")
        ratio = "-" if mode == "OFF" or off is None else f"{r['rps'] / off['rps']:.2f}x"
        d = r["difficulty_p10_p50_p90"]
        tiers = ", ".join(f"{k.split('-')[0]} {v}" for k, v in sorted(r["tiers"].items()))
        redis = ", ".join(f"{k} {v:.0f}" + (f" ({r['redis_failed'][k]:.0f} timed out)" if r["redis_failed"].get(k)
                                              else "") for k, v in r["redis_calls"].items()) or "none"
        notes = [f"{r['errors']} errors {r['error_samples']}"] if r["errors"] else []
        if r["truncated"]:
            notes.append("time limit hit")
        table.append([mode, c, r["n"], f"{r['rps']:.1f}", ratio, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", added,
                      f"{r.get('gateway_cpu_us_per_req', float('nan')) / 1e3:.2f}",
                      f"{100 * r.get('gateway_core_util', float('nan')):.0f}%", f"{r['classified']}/{r['n']}",
                      "-" if d is None else f"{d[0]:.2f} / {d[1]:.2f} / {d[2]:.2f}", tiers, redis, "; ".join(notes)])
    md = L.md_table(["classification", "c", "n", "req/s", "vs OFF", "p50 ms", "p99 ms", "added p50 / p99 ms",
                     "gateway CPU ms/req", "gateway core busy", "classified", "difficulty p10/p50/p90",
                     "tiers chosen", "gateway Redis calls", "notes"], table,
                    "--- ---: ---: ---: ---: ---: ---: ---: ---: ---: ---: --- --- --- ---")
    per_round = []
    for (mode, c), r in sorted(by.items(), key=lambda kv: (-kv[0][1], ["OFF", "ON cold", "ON warm"].index(kv[0][0]))):
        if c != 1:
            per_round.append(f"{mode}: " + ", ".join(f"{x['rps']:.0f}" for x in r["rounds"]))
    if per_round:
        md += "\n\nreq/s per round (drift check): " + "; ".join(per_round) + "."
    md += ("\n\nGateway Redis calls: the shared embedding store (`embedding_get` = one MGET, `embedding_put` = "
           "one SET EX pipeline, in the background) is consulted on an in-process LRU miss only; a cold prompt "
           "whose `embedding_get` is missing was not looked up because the gateway held Redis down "
           "(5 ms op timeout, 3 timeouts in a row -> 1 s without Redis).")
    if result["throughput"]["skipped"]:
        md += "\n\nSkipped (time budget): " + ", ".join(result["throughput"]["skipped"])
    return md


async def run_all(s: Settings, gw_port: int, gw_pid: int, redis: Any, pids: list[int], log: Any) -> dict[str, Any]:
    need = s.rounds * s.per_round + s.c1_requests + 2 * s.warmup
    pool = L.sharegpt_prompts(need, distinct=True, max_chars=s.max_chars)
    if len(pool) < need:
        raise RuntimeError(f"only {len(pool)} distinct ShareGPT prompts, need {need}")
    warm, rest = pool[: 2 * s.warmup], pool[2 * s.warmup:]
    rounds = [rest[i * s.per_round:(i + 1) * s.per_round] for i in range(s.rounds)]
    c1 = rest[s.rounds * s.per_round:][: s.c1_requests]
    chars = [len(p) for p in pool]
    log(f"{len(pool)} distinct ShareGPT first-turn prompts (<= {s.max_chars} chars): mean {np.mean(chars):.0f} "
        f"chars, p50 {np.median(chars):.0f}, p90 {np.percentile(chars, 90):.0f}")
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=L.TIMEOUT) as session:
        b = Bench(s, session, gw_port, gw_pid, redis, log)
        smoke = await L.post(session, b.url, chat("smoke test: how are you?"), b.headers("ON cold"), 0)
        if not smoke.ok or smoke.difficulty is None:
            raise RuntimeError(f"smoke test failed (no x-gateway-difficulty on an ON request): {smoke}")
        log(f"smoke test ok: difficulty {smoke.difficulty:.3f} -> tier {smoke.tier}")
        other = L.OtherWork(pids)
        with other.phase("measurement", log):
            out = await b.run(rounds, c1, warm)
    return {"throughput": out, "other_work": other.phases,
            "prompt_chars": {"mean": float(np.mean(chars)), "p50": float(np.median(chars)),
                             "p90": float(np.percentile(chars, 90))}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests (~1 minute)")
    parser.add_argument("--classifier", type=Path, default=L.ROOT / "models" / "difficulty",
                        help="trained difficulty model folder (head.onnx + metrics.json)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin the gateway to its own CPU")
    parser.add_argument("--no-redis", action="store_true", help="run the gateway without Redis")
    parser.add_argument("--concurrency", type=int, help="closed-loop concurrency (default 16)")
    args = parser.parse_args()
    s = QUICK if args.quick else FULL
    if args.concurrency:
        s = Settings(**{**asdict(s), "concurrency": args.concurrency})
    clf = args.classifier.resolve()
    if not (clf / "head.onnx").is_file() or not (clf / "metrics.json").is_file():
        print(f"{clf}/head.onnx or metrics.json is missing: train the classifier first (gateway train)",
              file=sys.stderr)
        return 2
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    def log(msg: str) -> None:
        print(msg, flush=True)

    run = L.begin(args.no_pin)
    started, load_start, host, gw_cpu, pin_note, procs = (
        run.started, run.load_start, run.host, run.gw_cpu, run.pin_note, run.procs)
    redis_server = None if args.no_redis else EmbeddedRedis()
    redis = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-classify-") as tmpdir:
            tmp = Path(tmpdir)
            try:
                if redis_server is not None:
                    redis_server.start()
                    redis = __import__("redis").Redis.from_url(redis_server.url)
                emu_port, gw_port = L.free_port(), L.free_port()
                emu = procs.start("emulator", L.emulator_argv(emu_port, "instant"), None, tmp / "emulator.out")
                (tmp / "config").mkdir()
                routes, policy = tmp / "config" / "routes.yaml", tmp / "config" / "policy.yaml"
                base = f"http://127.0.0.1:{emu_port}/v1"
                routes.write_text(L.routes_yaml({t: [(f"{t}-a", base)] for t in TIERS}))
                policy.write_text(L.policy_yaml(TIERS[0], [
                    {"name": "plain", "key": PLAIN_KEY},
                    {"name": "routed", "key": ROUTED_KEY, "routing": {"classifier": str(clf), "bands": BANDS}},
                ], max_tokens=1))
                gw_log = tmp / "gateway-requests.log"
                gw = procs.start("gateway", L.gateway_argv(routes, policy, gw_port, gw_log,
                                                           redis_server.url if redis_server else None, gw_cpu),
                                 None, tmp / "gateway.out")
                L.wait_http(f"http://127.0.0.1:{emu_port}/health", emu, "emulator")
                L.wait_gateway(gw_port, gw, timeout_s=90)
                gw_affinity = sorted(os.sched_getaffinity(gw.pid))
                startup = (tmp / "gateway.out").read_text(errors="replace")
                provider = next((ln for ln in startup.splitlines() if ln.startswith("classifier ")), "?")
                log(f"gateway pid {gw.pid} on CPUs {gw_affinity}; {provider}")
                pids = [os.getpid(), emu.pid, gw.pid]
                if redis_server is not None and redis_server.process is not None:
                    pids.append(redis_server.process.pid)
                result = uvloop.run(run_all(s, gw_port, gw.pid, redis, pids, log))
                procs.check_alive()
                result["gateway_log"] = L.log_events(gw_log)
                result["gateway_cpus"] = gw_affinity
                result["classifier_line"] = provider
            except Exception:
                L.print_tails(tmp, ("emulator.out", "gateway.out"))
                raise
            finally:
                procs.close()
                if redis is not None:
                    redis.close()
                if redis_server is not None:
                    redis_server.stop()
    except KeyboardInterrupt:
        print("interrupted; all benchmark processes stopped", file=sys.stderr)
        return 130
    metrics_file = clf / "metrics.json"
    result.update({
        "benchmark": "classify_throughput", "machine": host, "settings": asdict(s), "pinning": pin_note,
        "classifier": str(clf), "classifier_metrics_sha": L.key_sha256(metrics_file.read_text()),
        "head_onnx_mtime": dt.datetime.fromtimestamp((clf / "head.onnx").stat().st_mtime).isoformat(),
        "bands": BANDS, "redis": not args.no_redis, "command": L.command_line(), "loadavg_start": load_start,
        "loadavg_end": L.loadavg(), "elapsed_s": round(time.monotonic() - started, 1),
    })
    la0, la1 = result["loadavg_start"], result["loadavg_end"]
    header = (
        f"classify_throughput {host['date']}  {host['nproc']} x {host['cpu_model']}  gateway@{host['git_commit']}"
        f"{' (dirty)' if host['gateway_dirty'] else ''}  {'quick' if args.quick else 'full'} run, "
        f"{result['elapsed_s']} s\n\n{pin_note}; the classifier runs inside the gateway process on one ONNX "
        f"thread ({result['classifier_line']}). Non-streaming, model auto, max_tokens 1, `instant` emulator "
        f"tiers, closed loop without think time; Redis "
        f"{'on (response cache bypassed: no temperature)' if redis_server else 'off'}."
        f"\n\nLoad average (1/5/15 min) at start {la0[0]:.2f}/{la0[1]:.2f}/{la0[2]:.2f}, at end "
        f"{la1[0]:.2f}/{la1[1]:.2f}/{la1[2]:.2f} on {host['nproc']} CPUs.\n\nCommand: `{result['command']}`")
    gl = result["gateway_log"]
    busy = ", ".join(f"{k} {v['other_cores']:.2f}" for k, v in result.get("other_work", {}).items())
    md = (header + "\n\n" + render(result) + f"\n\nOther work on the machine meanwhile (cores busy outside "
          f"this benchmark's processes): {busy}. Gateway log events over the whole run: {gl['events']}.")
    print("\n" + md)
    path = L.write_results("classify_throughput", stamp, result, md)
    print(f"\nresults: {path.relative_to(L.ROOT)} (+ .md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
