"""Escalation on low confidence, measured on a real model (issue 39, section 4b).

    .venv/bin/python bench/escalation.py                 # measure both tiers, analyse, latency through the gateway
    .venv/bin/python bench/escalation.py --reuse         # analyse the answers recorded before (no model run)
    .venv/bin/python bench/escalation.py --latency 0     # skip the gateway phase

1. Answers: the labeled set (models/escalation-eval/items.jsonl, gateway.bench.escalation_items) asked of make run's
   two llama-server tiers, each its own server (one thread, one slot): small-q4 (Gemma 3 270M Q4_K_M) and large-f16
   (the same weights in F16), /v1/completions, greedy (temperature 0), max_tokens 8, stop "\\n", `logprobs: 1`, as the
   gateway asks. Recorded in models/escalation-eval/runs/<tier>.jsonl: text, each token's logprob, tokens, ms.
2. Analysis: correctness by exact match (`escalation_items.correct`); the confidence the gateway computes
   (gateway.routing.escalate: the geometric mean of the tokens' probabilities) and two alternatives (the least
   likely token, the first token); AUROC for the small tier's correctness, with a bootstrap interval. The
   quality-cost curve: escalating the share r of answers of lowest confidence (r = 5 % .. 95 %) to the large tier
   (measured: large-f16's own correctness on the item; and an ideal large tier that is always right), against
   routing alone (small-q4 for all) and against escalating a random share r (its expectation over random subsets,
   exactly), with a paired bootstrap interval (items resampled, both arms on the same resample) of the difference.
   Cost at routes/local.yaml's prices from each answer's tokens: escalated items pay both parts.
3. Latency: a gateway (`gateway serve`, no Redis) in front of the same two servers, a tenant with
   `escalate: {min_confidence: C}` (C: the median small-tier confidence, so about half escalate), and the same
   tenant without it; the same items non-streamed through each, alternately: end-to-end ms of kept answers (the
   log-probabilities asked and stripped), of escalated ones, and without escalation.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import math
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from gateway.bench.escalation_items import correct, items
from gateway.bench.procs import Procs, free_port, gateway_argv, wait_gateway, wait_http
from gateway.bench.report import ROOT
from gateway.local import llama_build, models
from gateway.routing.escalate import confidence, token_logprobs

DATA = ROOT / "models" / "escalation-eval"
TIERS = {"small-q4": (models.Q4, 0.078, 0.214), "large-f16": (models.F16, 0.089, 0.283)}  # routes/local.yaml
PARAMS = {"max_tokens": 8, "temperature": 0, "stop": ["\n"]}
RATES = [round(0.05 * i, 2) for i in range(1, 20)]
KEY = "sk-escalation-bench"
HOLD_KEY, HOLD = "sk-escalation-hold", 4  # streams held for their first 4 tokens


def server_argv(model: str, port: int) -> list[str]:
    return [str(llama_build.server_binary()), "--model", str(models.resolve(model)), "--host", "127.0.0.1",
            "--port", str(port), "--ctx-size", "1024", "--parallel", "1", "--threads", "1", "--threads-batch", "1",
            "--no-webui"]


def wait_ready(url: str, name: str, timeout_s: float = 120) -> None:
    """Until llama-server's /health says 200 (503 while the model loads)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{name} was not ready within {timeout_s} s")


async def ask_all(url: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each item's answer from one server, one at a time."""
    out = []
    async with aiohttp.ClientSession() as session:
        for row in rows:
            body = {"model": "m", "prompt": row["prompt"], **PARAMS, "logprobs": 1}
            t0 = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as response:
                answer = await response.json()
            ms = (time.perf_counter() - t0) * 1000
            choice = answer["choices"][0]
            out.append({"id": row["id"], "text": choice["text"], "logprobs": token_logprobs(choice),
                        "prompt_tokens": answer["usage"]["prompt_tokens"],
                        "completion_tokens": answer["usage"]["completion_tokens"], "ms": round(ms, 2)})
    return out


async def measure(rows: list[dict[str, Any]], procs: Procs, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    urls = {}
    for name, (model, _, _) in TIERS.items():
        port = free_port()
        proc = procs.start(name, server_argv(model, port), None, tmp / f"{name}.log")
        urls[name] = f"http://127.0.0.1:{port}"
        wait_http(f"{urls[name]}/health", proc, name, timeout_s=120)
        wait_ready(urls[name], name)
    runs = await asyncio.gather(*(ask_all(url, rows) for url in urls.values()))
    return dict(zip(urls, runs))


# -- analysis

def auroc(scores: list[float], labels: list[bool]) -> float:
    """P(score of a correct item > score of a wrong one), ties half (Mann-Whitney)."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    if not pos or not neg:
        return float("nan")
    ranked = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(ranked):
        j = i
        while j + 1 < len(ranked) and scores[ranked[j + 1]] == scores[ranked[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[ranked[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels) if y)
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def interval(values: list[float]) -> tuple[float, float]:
    ordered = sorted(v for v in values if not math.isnan(v))
    return ordered[int(0.025 * (len(ordered) - 1))], ordered[int(0.975 * (len(ordered) - 1))]


def cascade(conf: list[float], small: list[bool], large: list[bool], rate: float, order: list[int]) -> float:
    """Accuracy when the share `rate` of lowest confidence (over the items `order` lists) goes to the large tier."""
    k = round(rate * len(order))
    ranked = sorted(order, key=lambda i: conf[i])  # stable: ties by position
    up = ranked[:k]
    return (sum(small[i] for i in order) + sum(large[i] - small[i] for i in up)) / len(order)


def random_cascade(small: list[bool], large: list[bool], rate: float, order: list[int]) -> float:
    """The expected accuracy of escalating round(rate * n) items chosen at random (exact, over all subsets)."""
    k = round(rate * len(order))
    n = len(order)
    return (sum(small[i] for i in order) + k / n * sum(large[i] - small[i] for i in order)) / n


def price(tier: str, prompt: int, completion: int) -> float:
    _, inp, out = TIERS[tier]
    return (prompt * inp + completion * out) / 1e6


def analyse(rows: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]], boot: int) -> dict[str, Any]:
    small_run, large_run = runs["small-q4"], runs["large-f16"]
    small = [correct(r["text"], row) for r, row in zip(small_run, rows)]
    large = [correct(r["text"], row) for r, row in zip(large_run, rows)]
    measures = {
        "geometric mean (served)": [confidence(r["logprobs"]) or 0.0 for r in small_run],
        "least likely token": [math.exp(min(r["logprobs"])) if r["logprobs"] else 0.0 for r in small_run],
        "first token": [math.exp(r["logprobs"][0]) if r["logprobs"] else 0.0 for r in small_run],
    }
    rng = random.Random(39)
    n = len(rows)
    samples = [[rng.randrange(n) for _ in range(n)] for _ in range(boot)]
    out: dict[str, Any] = {"n": n, "small_acc": sum(small) / n, "large_acc": sum(large) / n,
                           "both": sum(a and b for a, b in zip(small, large)),
                           "small_only": sum(a and not b for a, b in zip(small, large)),
                           "large_only": sum(b and not a for a, b in zip(small, large)), "auroc": {}}
    for name, conf in measures.items():
        point = auroc(conf, small)
        lo, hi = interval([auroc([conf[i] for i in s], [small[i] for i in s]) for s in samples])
        out["auroc"][name] = (point, lo, hi)
    conf = measures["geometric mean (served)"]
    kinds: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        kinds.setdefault(row["kind"], []).append(i)
    weights = [(sum(small[i] for i in ix) * sum(not small[i] for i in ix), ix) for ix in kinds.values()]
    out["within_kind"] = {name: sum(w * auroc([m[i] for i in ix], [small[i] for i in ix]) for w, ix in weights if w)
                          / sum(w for w, _ in weights) for name, m in measures.items()}
    out["by_kind"] = {kind: (len(ix), sum(small[i] for i in ix) / len(ix), sum(large[i] for i in ix) / len(ix),
                             auroc([conf[i] for i in ix], [small[i] for i in ix])) for kind, ix in kinds.items()}
    costs_small = [price("small-q4", r["prompt_tokens"], r["completion_tokens"]) for r in small_run]
    costs_large = [price("large-f16", r["prompt_tokens"], r["completion_tokens"]) for r in large_run]
    base_cost = sum(costs_small) / n
    ideal = [True] * n
    curve = []
    everyone = list(range(n))
    ranked = sorted(everyone, key=lambda i: conf[i])
    for rate in RATES:
        k = round(rate * n)
        row_out: dict[str, Any] = {"rate": rate, "threshold": conf[ranked[k - 1]] if k else None,
                                   "cost": (base_cost + sum(costs_large[i] for i in ranked[:k]) / n) / base_cost,
                                   "latency_ms": statistics.mean(small_run[i]["ms"] for i in everyone)
                                   + sum(large_run[i]["ms"] for i in ranked[:k]) / n}
        least = measures["least likely token"]
        for label, big, signal in (("f16", large, conf), ("ideal", ideal, conf), ("ideal_min", ideal, least)):
            point = cascade(signal, small, big, rate, everyone)
            chance = random_cascade(small, big, rate, everyone)
            diffs = [cascade(signal, small, big, rate, s) - random_cascade(small, big, rate, s) for s in samples]
            row_out[label] = (point, chance, point - chance, *interval(diffs))
        curve.append(row_out)
    out["curve"] = curve
    out["escalated_latency_ms"] = statistics.median(large_run[i]["ms"] for i in everyone)
    out["small_latency_ms"] = statistics.median(small_run[i]["ms"] for i in everyone)
    return out


def report(res: dict[str, Any]) -> str:
    lines = [f"items: {res['n']}; small-q4 correct {res['small_acc']:.1%}, large-f16 correct {res['large_acc']:.1%} "
             f"(both right {res['both']}, small only {res['small_only']}, large only {res['large_only']})", "",
             "| confidence (small-q4) | AUROC for correctness | 95 % bootstrap | within kinds (pairs of one kind only) |",
             "| --- | ---: | --- | ---: |"]
    for name, (point, lo, hi) in res["auroc"].items():
        lines.append(f"| {name} | {point:.3f} | {lo:.3f} – {hi:.3f} | {res['within_kind'][name]:.3f} |")
    lines += ["", "| kind | items | small-q4 correct | large-f16 correct | AUROC (served) |", "| --- | ---: | ---: | ---: | ---: |"]
    for kind, (count, s, lg, a) in res["by_kind"].items():
        lines.append(f"| {kind} | {count} | {s:.0%} | {lg:.0%} | {'–' if math.isnan(a) else f'{a:.2f}'} |")
    lines += ["", "| escalated | below confidence | cost × | mean model ms | to large-f16: accuracy (random) "
              "| gain over random [95 %] | to an always-right tier: accuracy (random) | gain over random [95 %] "
              "| the same, least likely token: accuracy | gain over random [95 %] |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in res["curve"]:
        f16, ideal, least = row["f16"], row["ideal"], row["ideal_min"]
        lines.append(f"| {row['rate']:.0%} | {row['threshold']:.3f} | {row['cost']:.2f} | {row['latency_ms']:.0f} "
                     f"| {f16[0]:.1%} ({f16[1]:.1%}) | {f16[2]:+.1%} [{f16[3]:+.1%}, {f16[4]:+.1%}] "
                     f"| {ideal[0]:.1%} ({ideal[1]:.1%}) | {ideal[2]:+.1%} [{ideal[3]:+.1%}, {ideal[4]:+.1%}] "
                     f"| {least[0]:.1%} | {least[2]:+.1%} [{least[3]:+.1%}, {least[4]:+.1%}] |")
    lines.append(f"\nrouting alone (small-q4 for all): {res['small_acc']:.1%} at cost × 1.00; "
                 f"median model ms per answer: small-q4 {res['small_latency_ms']:.0f}, large-f16 "
                 f"{res['escalated_latency_ms']:.0f}")
    return "\n".join(lines)


# -- latency through the gateway

def gateway_files(tmp: Path, urls: dict[str, str], min_confidence: float) -> tuple[Path, Path]:
    tiers = [{"name": name, "precision": "int4" if name == "small-q4" else "fp16", "context_window": 1024,
              "prices": {"input_per_mtok": TIERS[name][1], "output_per_mtok": TIERS[name][2]},
              "tokenizer": "gguf:gemma3-270m-q4_k_m", "slots_per_replica": 1,
              "replicas": [{"name": f"{name}-a", "url": f"{url}/v1", "model": name}]} for name, url in urls.items()]
    routes = tmp / "routes.yaml"
    routes.write_text(yaml.safe_dump({"tiers": tiers, "balancing": {"scrape_interval_s": 1}}))
    digest = hashlib.sha256
    policy = {"default_tier": "small-q4", "max_tokens": {"default": 8, "maximum": 64}, "tenants": [
        {"name": "escalate", "api_key_sha256": digest(KEY.encode()).hexdigest(),
         "escalate": {"min_confidence": round(min_confidence, 4)}},
        {"name": "plain", "api_key_sha256": digest(b"sk-plain").hexdigest()},
        {"name": "hold", "api_key_sha256": digest(HOLD_KEY.encode()).hexdigest(),
         "escalate": {"min_confidence": round(min_confidence, 4), "hold_tokens": HOLD}}]}
    policies = tmp / "policies.yaml"
    policies.write_text(yaml.safe_dump(policy))
    return routes, policies


async def one(session: aiohttp.ClientSession, url: str, key: str, prompt: str, stream: bool
              ) -> tuple[str, bool, float, float, str | None]:
    """(key, stream, e2e ms, ms to the first content byte, escalated_from) of one request."""
    body = {"model": "auto", "prompt": prompt, **PARAMS, "stream": stream}
    t0 = time.perf_counter()
    first = None
    async with session.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status == 200, response.status
        escalated = response.headers.get("x-gateway-escalated-from")
        async for line in response.content:
            if first is None and line.startswith(b"data: {") and b'"text":"' in line and b'"text":""' not in line:
                first = time.perf_counter()
    end = time.perf_counter()
    return key, stream, (end - t0) * 1000, ((first or end) - t0) * 1000, escalated


async def through_gateway(url: str, rows: list[dict[str, Any]]) -> list[tuple[str, bool, float, float, str | None]]:
    """Each item asked four ways (whole: without and with escalate; streamed: without and with the hold), the
    order rotated from item to item."""
    ways = [("sk-plain", False), (KEY, False), ("sk-plain", True), (HOLD_KEY, True)]
    out = []
    async with aiohttp.ClientSession() as session:
        for i, row in enumerate(rows):
            for key, stream in ways[i % 4:] + ways[:i % 4]:
                out.append(await one(session, url, key, row["prompt"], stream))
    return out


def table(title: str, groups: list[tuple[str, list[float], list[float] | None]]) -> list[str]:
    lines = ["", f"| {title} | n | p50 ms | p90 ms | paired Δ vs without, p50 ms |", "| --- | ---: | ---: | ---: | ---: |"]
    for label, values, paired in groups:
        if not values:
            continue
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        delta = "–" if not paired else f"{statistics.median(paired):+.1f}"
        lines.append(f"| {label} | {len(values)} | {statistics.median(values):.1f} | {p90:.1f} | {delta} |")
    return lines


async def latency(rows: list[dict[str, Any]], count: int, threshold: float, procs: Procs, tmp: Path) -> str:
    urls = {}
    for name, (model, _, _) in TIERS.items():
        port = free_port()
        proc = procs.start(f"{name}-latency", server_argv(model, port), None, tmp / f"{name}-latency.log")
        urls[name] = f"http://127.0.0.1:{port}"
        wait_http(f"{urls[name]}/health", proc, name, timeout_s=120)
        wait_ready(urls[name], name)
    routes, policies = gateway_files(tmp, urls, threshold)
    port = free_port()
    proc = procs.start("gateway", gateway_argv(routes, policies, port, tmp / "requests.log", None, None), None,
                       tmp / "gateway.log")
    wait_gateway(port, proc)
    chosen = random.Random(7).sample(rows, count)
    results = await through_gateway(f"http://127.0.0.1:{port}", chosen)
    by: dict[tuple[str, bool], list[tuple[float, float, str | None]]] = {}
    for key, stream, e2e, ttft, up in results:
        by.setdefault((key, stream), []).append((e2e, ttft, up))
    whole_plain, whole = by[("sk-plain", False)], by[(KEY, False)]
    stream_plain, held = by[("sk-plain", True)], by[(HOLD_KEY, True)]
    lines = [f"min_confidence {threshold:.4f} (hold_tokens {HOLD} for the streams); {count} items, each asked four "
             "ways through one gateway"]
    lines += table("non-streamed, end to end", [
        ("without escalate", [e for e, _, _ in whole_plain], None),
        ("escalate: kept", [e for e, _, u in whole if u is None],
         [w[0] - p[0] for w, p in zip(whole, whole_plain) if w[2] is None]),
        ("escalate: escalated", [e for e, _, u in whole if u is not None],
         [w[0] - p[0] for w, p in zip(whole, whole_plain) if w[2] is not None])])
    lines += table("streamed, time to first token", [
        ("without hold", [t for _, t, _ in stream_plain], None),
        (f"hold {HOLD}: kept", [t for _, t, u in held if u is None],
         [h[1] - p[1] for h, p in zip(held, stream_plain) if h[2] is None]),
        (f"hold {HOLD}: escalated", [t for _, t, u in held if u is not None],
         [h[1] - p[1] for h, p in zip(held, stream_plain) if h[2] is not None])])
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reuse", action="store_true", help="analyse the recorded answers (models/escalation-eval/runs)")
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--latency", type=int, default=60, help="items asked through the gateway (0: skip)")
    args = p.parse_args()
    rows = items()
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / "items.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    procs = Procs()
    with tempfile.TemporaryDirectory(prefix="escalation-") as folder:
        tmp = Path(folder)
        try:
            if args.reuse:
                runs = {name: [orjson.loads(line) for line in (DATA / "runs" / f"{name}.jsonl").read_bytes().splitlines()]
                        for name in TIERS}
            else:
                t0 = time.perf_counter()
                runs = asyncio.run(measure(rows, procs, tmp))
                procs.close()
                print(f"answers: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
                (DATA / "runs").mkdir(exist_ok=True)
                for name, run in runs.items():
                    (DATA / "runs" / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in run))
            res = analyse(rows, runs, args.bootstrap)
            print(report(res))
            if args.latency:
                conf = sorted(confidence(r["logprobs"]) or 0.0 for r in runs["small-q4"])
                print()
                print(asyncio.run(latency(rows, args.latency, conf[len(conf) // 2], procs, tmp)))
        except Exception:
            procs.print_tails()
            raise
        finally:
            procs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
