"""Routing on measured outcomes (issue 33): the quality router against random, prompt length, the rubric head,
kNN and the oracle, on held-out prompts of ../shared/outcomes, with bootstrap 95 % intervals; and its cost.

    .venv/bin/python bench/routing_outcomes.py [--rounds 1000] [--outcomes DIR] [--cache DIR] [--no-docs]

Designs, pairs and routers: gateway.training.router_eval. Metrics (gateway.training.route_metrics): RouteLLM's
APGR on 11 thresholds at the deciles of each router's own scores, CPT(50 %) and CPT(80 %) (strong-call share
recovering that much of the strong-weak gap), and the strong-call share reaching 95 % of the strong model's
mean quality; each with a bootstrap 95 % interval (`--rounds` resamples of the test prompts, the same for every
router, so differences are paired). Every fit sees only its design's training rows; the rubric gate's constant
and the L2 are the shipped ones (gateway.training.router_train), picked on validation folds of the hash split's
training rows ("Selection" below, recomputed by every run).

Also: the selection grid (validation APGR and the hand-written pairs of tests/data/difficulty_pairs.jsonl ordered
by gain, per blend weight and gate constant), and the serving cost: one cold prompt of 128 tokens on one CPU thread through the encoder + difficulty head,
with and without the quality router on the same embedding (p50 / p99 ms, prompts per second).

Writes the `issue-33-routing-outcomes` block of docs/BENCHMARKS.md, the `evaluation` of
models/router/metrics.json (and its SHA256SUMS line), and JSON + markdown under bench/results/.
Embeddings are cached in --cache (default /tmp/gateway-router-cache), never in the repository.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gateway.bench.report import ROOT, command_line, load_line, md_table, replace_marked, stamp, write_results
from gateway.classifier.encoder import EncoderSession
from gateway.classifier.head import HeadSession, log_chars
from gateway.classifier.prompt_features import feature_matrix
from gateway.classifier.quality_head import QualityHead
from gateway.classifier.tokenize import PromptTokenizer
from gateway.training.export import update_sums
from gateway.training.outcomes import read_outcomes
from gateway.training.router_data import DIFFICULTY_DIR, encoder_of, load_outcome_set
from gateway.training.router_eval import (
    PAIRS, ROUTERS, Context, Fitted, Pair, direct_gain, hash_design, loso_design, loto_design, validation_grid,
)
from gateway.training.router_fit import fit_linear, knn_predict
from gateway.training.router_train import DEFAULT_ALPHA, DEFAULT_GATE, DEFAULT_L2, KNN_K
from gateway.training.embedding import EmbeddingFile

ROUTER_DIR = ROOT / "models" / "router"
DOC = ROOT / "docs" / "BENCHMARKS.md"
PAIRS_FILE = ROOT / "tests" / "data" / "difficulty_pairs.jsonl"
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
GATES = (0.0, 0.1, 0.2, 0.5, 1.0)
REQUIRED_PAIRS = 0.96  # the selection's bar: 95 % is required (tests/unit/test_outcomes_shipped.py), one point of margin
SHOWN = ("random", "length", "rubric", "knn", "linear", "router", "oracle")
FOCUS_TASKS = ("mmlu", "gsm8k")


def fmt(value: list[float]) -> str:
    v, lo, hi = value
    return "n/a" if not np.isfinite(v) else f"{v:.3f} [{lo:.2f}, {hi:.2f}]"


def routers_table(result: dict[str, Any]) -> str:
    rows = []
    for name in SHOWN:
        m = result["routers"][name]
        rows.append([f"**{name}**" if name == "router" else name, fmt(m["apgr"]), fmt(m["cpt50"]), fmt(m["cpt80"]),
                     fmt(m["share95"])])
    return md_table(["router", "APGR", "CPT(50 %)", "CPT(80 %)", "strong share for 95 % of strong quality"], rows,
                    "--- ---: ---: ---: ---:")


def loto_table(results: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    means: dict[str, list[float]] = {name: [] for name in SHOWN}
    for task, r in results.items():
        if "skipped" in r:
            rows.append([task, r["n"], f"skipped: {r['skipped']}"] + [""] * (len(SHOWN) - 1))
            continue
        for name in SHOWN:
            means[name].append(r["routers"][name]["apgr"][0])
        rows.append([task, r["n"]] + [fmt(r["routers"][name]["apgr"]) for name in SHOWN])
    rows.append(["**mean**", sum(r["n"] for r in results.values() if "skipped" not in r)]
                + [f"**{np.mean(v):.3f}**" for v in means.values()])
    return md_table(["held-out task", "n", *SHOWN], rows, "--- ---: " + " ".join(["---:"] * len(SHOWN)))


def paired_table(named: dict[str, dict[str, Any]]) -> str:
    rows = []
    for label, r in named.items():
        d = r["router_minus"]
        rows.append([label, r["n"]] + [fmt(d[b]) + (" *" if d[b][1] > 0 or d[b][2] < 0 else "") for b in d])
    return md_table(["test set", "n", "router − length", "router − kNN", "router − rubric"], rows, "--- ---: ---: ---: ---:")


def loto_means(loto: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out = {}
    for pair, tasks in loto.items():
        kept = [r for r in tasks.values() if "skipped" not in r]
        out[pair] = {name: round(float(np.mean([r["routers"][name]["apgr"][0] for r in kept])), 4) for name in SHOWN}
    return out


def pairs_ordered(ctx: Context, alphas: tuple[float, ...], gates: tuple[float, ...],
                  pair: Pair) -> dict[tuple[float, float], float]:
    """{(alpha, gate_h0): share of the hand-written pairs whose hard prompt gets the larger gain of `pair`}, with
    the linear outputs and kNN fitted on every outcome row (as shipped)."""
    pairs = [json.loads(line) for line in PAIRS_FILE.read_text("utf-8").split("\n") if line.strip()]
    enc = encoder_of()
    session = EncoderSession(enc["path"], providers=["CPUExecutionProvider"], tokenizer=PromptTokenizer(enc["max_tokens"]))
    cache = EmbeddingFile(None, enc["sha256"], enc["max_tokens"])
    rubric = HeadSession(DIFFICULTY_DIR / "head.onnx")
    everything = np.ones(len(ctx.data.rows), dtype=bool)
    sides = {}
    for side in ("easy", "hard"):
        texts = [p[side] for p in pairs]
        emb = cache.embed(session, texts, f"pairs {side}")
        x = np.hstack([emb, feature_matrix(texts)]).astype(np.float64)
        linear = fit_linear(ctx.data.x, ctx.data.targets, ctx.data.models, ctx.l2).predict(x)
        knn = knn_predict(ctx.data.embeddings[everything], ctx.data.targets, emb, KNN_K)
        sides[side] = Fitted(linear, knn, rubric.score(emb, log_chars(texts)).astype(np.float64))
    gain = direct_gain(ctx, pair)
    return {(a, g): float(np.mean(gain(sides["hard"].router(a, g)) > gain(sides["easy"].router(a, g))))
            for a in alphas for g in gates}


def selection(ctx: Context) -> list[list[Any]]:
    """The grid the shipped blend weight and gate were picked from: validation APGR and pairs ordered."""
    val = validation_grid(ctx, ALPHAS, GATES)
    ordered = [pairs_ordered(ctx, ALPHAS, GATES, pair) for pair in PAIRS[:2]]
    eligible = [key for key in val if all(o[key] >= REQUIRED_PAIRS for o in ordered)]
    best = max(eligible, key=lambda key: val[key]) if eligible else None
    if best != (DEFAULT_ALPHA, DEFAULT_GATE):
        print(f"WARNING: the selection rule picks {best}, the shipped router uses {(DEFAULT_ALPHA, DEFAULT_GATE)}")
    rows = []
    for a in ALPHAS:
        for g in GATES:
            cells = [a, g, f"{val[a, g]:.4f}", *(f"{o[a, g]:.1%}" for o in ordered)]
            rows.append([f"**{c}**" for c in cells] if (a, g) == best else cells)
    return rows


def latency(runs: int = 400) -> dict[str, Any]:
    """Cold prompts of 128 tokens, one at a time, one CPU thread: encoder + difficulty head, then + the router."""
    spec = importlib.util.spec_from_file_location("classifier_latency", ROOT / "bench" / "classifier_latency.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["classifier_latency"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    texts: list[str] = module.prompts_of(PromptTokenizer(512), 128, runs, random.Random(33))
    enc = encoder_of()
    session = EncoderSession(enc["path"], providers=["CPUExecutionProvider"], threads=1,
                             tokenizer=PromptTokenizer(enc["max_tokens"]))
    difficulty = HeadSession(DIFFICULTY_DIR / "head.onnx")
    router = QualityHead.load(ROUTER_DIR / "router.npz", HeadSession(DIFFICULTY_DIR / "head.onnx"))
    names = ("encoder + difficulty head", "encoder + difficulty head + router", "router alone (features, outputs, gate)")
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for i, text in enumerate(texts):
        start, start_cpu = time.perf_counter(), time.thread_time()
        emb = session.embed([text])
        difficulty.score(emb, log_chars([text]))
        mid, mid_cpu = time.perf_counter(), time.thread_time()
        router.scores(emb, [text])
        end, end_cpu = time.perf_counter(), time.thread_time()
        if i >= 10:
            for name, (a, b, ca, cb) in zip(names, ((start, mid, start_cpu, mid_cpu), (start, end, start_cpu, end_cpu),
                                                   (mid, end, mid_cpu, end_cpu))):
                wall[name].append((b - a) * 1e3)
                cpu[name].append((cb - ca) * 1e3)
    return {name: {"p50_ms": round(float(np.percentile(wall[name], 50)), 3),
                   "p99_ms": round(float(np.percentile(wall[name], 99)), 3),
                   "cpu_ms_mean": round(float(np.mean(cpu[name])), 3),
                   "per_cpu_second": round(1e3 / max(float(np.mean(cpu[name])), 1e-6), 1)} for name in names}


def latency_table(lat: dict[str, Any]) -> str:
    return md_table(["path", "wall p50 ms", "wall p99 ms", "CPU ms each", "prompts per CPU-second"],
                    [[k, v["p50_ms"], v["p99_ms"], v["cpu_ms_mean"], v["per_cpu_second"]] for k, v in lat.items()],
                    "--- ---: ---: ---: ---:")


def markdown(result: dict[str, Any]) -> str:
    h, loto, loso = result["hash"], result["loto"], result["loso"]
    parts = [f"Command: `{result['command']}` ({result['when']}; {result['load']}). Bootstrap: {result['rounds']} "
             "resamples of the test prompts, the same for every router; [2.5 %, 97.5 %] in brackets.", ""]
    parts.append("**Hash split** (train on the prompts whose normalized text hashes to train, all sources; test on "
                 "the rest of the pair's source):")
    for pair, r in h.items():
        parts += ["", f"*{pair}*: n = {r['n']}, weak {r['weak_mean']:.3f}, strong {r['strong_mean']:.3f}", "",
                  routers_table(r)]
    parts += ["", "**Leave one task out** (APGR; train on every other task and source, test on the task):"]
    for pair, tasks in loto.items():
        parts += ["", f"*{pair}*", "", loto_table(tasks)]
    parts += ["", "**Leave one source out** (train on the other sources; the test pair is scored by the mean of the "
              "other sources' pairs' standardized predicted gains):"]
    for pair, r in loso.items():
        parts += ["", f"*{pair}*, scored by {', '.join(r['scored_by'])}: n = {r['n']}", "", routers_table(r)]
    focus = {f"hash, {p}": r for p, r in h.items()}
    for pair, tasks in loto.items():
        focus |= {f"leave-one-task-out {t}, {pair}": tasks[t] for t in FOCUS_TASKS if "skipped" not in tasks.get(t, {"skipped": 1})}
    parts += ["", "**Paired differences** (APGR of the router minus the baseline on the same resamples; * = the "
              "interval excludes 0):", "", paired_table(focus)]
    lat = result["latency"]
    parts += ["", "**Serving cost** (cold prompts of 128 tokens, one at a time, one CPU thread (ONNX Runtime intra-op "
              "1), the shipped files; wall time suffers from the machine's load, the thread's CPU time much less):",
              "", latency_table(lat)]
    parts += ["", "**Selection** of the blend weight alpha (router = alpha · logistic + (1 − alpha) · kNN) and the "
              "rubric gate h0 (quality = 1 − h/(h + h0) · (1 − router)): mean APGR over the four pairs on 4 validation "
              "folds of the hash split's training rows (the test rows unseen), and the share of the hand-written pairs "
              "ordered by the 7B → 51B and the 7B → 49B gain; shipped (bold): the best validation APGR among those "
              f"ordering ≥ {REQUIRED_PAIRS:.0%} by both:", "",
              md_table(["alpha", "h0", "validation APGR", "pairs ordered, 7B → 51B", "pairs ordered, 7B → 49B"],
                       result["selection"], "---: ---: ---: ---: ---:")]
    return "\n".join(parts)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers metrics.json keeps."""
    return {
        "command": result["command"], "when": result["when"], "rounds": result["rounds"],
        "hash_apgr": {p: {k: r["routers"][k]["apgr"] for k in ROUTERS} for p, r in result["hash"].items()},
        "loto_mean_apgr": loto_means(result["loto"]),
        "loso_apgr": {p: {k: r["routers"][k]["apgr"] for k in ROUTERS} for p, r in result["loso"].items()},
        "latency": result["latency"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--outcomes", type=Path, default=ROOT.parent / "shared" / "outcomes")
    p.add_argument("--cache", type=Path, default=Path("/tmp/gateway-router-cache"))
    p.add_argument("--no-docs", action="store_true", help="print only; leave docs and metrics.json alone")
    p.add_argument("--latency-only", type=int, metavar="RUNS", default=0,
                   help="only the serving cost table, on RUNS cold prompts (docs untouched)")
    args = p.parse_args()
    if args.latency_only:
        print(f"{command_line()} ({stamp()}; {load_line()})\n\n{latency_table(latency(args.latency_only))}")
        return 0
    started = time.perf_counter()
    rows = read_outcomes(sorted(args.outcomes.glob("*.jsonl")))
    data = load_outcome_set(rows, cache_dir=args.cache)
    hard = HeadSession(DIFFICULTY_DIR / "head.onnx").score(data.embeddings, log_chars([r.prompt for r in data.rows]))
    ctx = Context(data, hard.astype(np.float64), DEFAULT_GATE, DEFAULT_L2, DEFAULT_ALPHA)
    result: dict[str, Any] = {"command": command_line(), "when": stamp(), "load": load_line(), "rounds": args.rounds}
    result["hash"] = hash_design(ctx, args.rounds)
    print("hash split done", flush=True)
    dc = tuple(pair for pair in PAIRS if pair.source == PAIRS[0].source)
    result["loto"] = loto_design(ctx, dc, args.rounds)
    print("leave-one-task-out done", flush=True)
    result["loso"] = loso_design(ctx, args.rounds)
    result["selection"] = selection(ctx)
    result["latency"] = latency()
    result["seconds"] = round(time.perf_counter() - started, 1)
    text = markdown(result)
    print(text)
    write_results("routing_outcomes", result["when"], result, text)
    if not args.no_docs:
        replace_marked(DOC, "issue-33-routing-outcomes", "<!-- generated by bench/routing_outcomes.py: do not edit "
                       "by hand, rerun it -->\n" + text, "## Routing on measured outcomes (issue 33)")
        path = ROUTER_DIR / "metrics.json"
        metrics = json.loads(path.read_text(encoding="utf-8"))
        metrics["evaluation"] = summary(result)
        path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
        update_sums(ROUTER_DIR, ["metrics.json"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
