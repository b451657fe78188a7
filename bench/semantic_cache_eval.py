"""Semantic cache: how well the encoder + a Redis vector set tell paraphrases from other requests.

Embeds both sides of models/semantic-eval/pairs.jsonl with the project's encoder, indexes the
distinct `a` prompts in a real embedded Redis (through SemanticIndex: VADD ... Q8), queries every
`b` (VSIM top-1) and counts, per threshold on the cosine:
  TP: the top-1 is the labeled paraphrase of `b`;  FP: any other hit (a wrong answer would be served),
  split into near misses (the top-1 is the pair's own `a`: a hard negative) and hits on other prompts.
Precision comes first: the recommended default is the lowest threshold with precision >= 0.95, if any.
Then the VSIM top-1 latency from Python over 5,000 x 384 random unit vectors.

    .venv/bin/python bench/semantic_cache_eval.py [--pairs PATH] [--model ONNX] [--vectors 5000] [--queries 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gateway.bench.summary import percentile
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.cache.semantic import SemanticIndex
from gateway.classifier.encoder import EncoderSession, default_model_path
from gateway.local.redis_server import EmbeddedRedis

ROOT = Path(__file__).resolve().parents[1]
THRESHOLDS = [round(0.80 + 0.02 * i, 2) for i in range(10)]
TARGET_PRECISION = 0.95


class Hit(NamedTuple):
    """One query's top-1: its cosine, whether it is the labeled paraphrase, whether it is the pair's `a`."""

    kind: str
    label: int
    cosine: float
    right: bool
    own: bool


def load_pairs(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def score(hits: list[Hit], positives: int, negatives: int, threshold: float) -> dict[str, float]:
    """Counts and rates at `threshold`; a false hit is a near miss when its top-1 is the pair's own `a`."""
    tp = sum(1 for hit in hits if hit.cosine >= threshold and hit.right)
    wrong = [hit for hit in hits if hit.cosine >= threshold and not hit.right]
    near = sum(1 for hit in wrong if hit.own)
    precision = tp / (tp + len(wrong)) if tp + len(wrong) else 1.0
    recall = tp / positives
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"threshold": threshold, "tp": tp, "fp": len(wrong), "fp_near": near, "fp_other": len(wrong) - near,
            "fn": positives - tp, "precision": precision, "recall": recall, "f1": f1,
            "false_hit_rate": sum(1 for hit in wrong if hit.label == 0) / negatives}


async def evaluate(index: SemanticIndex, encoder: EncoderSession, pairs: list[dict[str, Any]]) -> None:
    anchors = sorted({pair["a"] for pair in pairs})
    anchor_vectors = encoder.embed(anchors)
    for number, vector in enumerate(anchor_vectors):
        await index.add("eval", f"a{number}", vector, ttl_s=3600)
    queries = encoder.embed([pair["b"] for pair in pairs])
    hits: list[Hit] = []
    exact_gap = []
    for pair, vector in zip(pairs, queries, strict=True):
        found = await index.nearest("eval", vector)
        assert found is not None, "the index answered nothing: is Redis up?"
        number = int(found[0][1:])
        own = anchors[number] == pair["a"]
        hits.append(Hit(pair["kind"], pair["label"], found[1], pair["label"] == 1 and own, own))
        exact_gap.append(abs(found[1] - float(anchor_vectors[number] @ vector)))
    positives = sum(pair["label"] for pair in pairs)
    rows = [score(hits, positives, len(pairs) - positives, t) for t in THRESHOLDS]
    print(f"{len(pairs)} pairs ({positives} paraphrases), {len(anchors)} distinct prompts indexed; "
          f"encoder {encoder.model_path.name} on {encoder.provider}; Q8 |cos error| max {max(exact_gap):.4f}\n")
    print("| threshold | TP | FP (near miss / other) | FN | precision | recall | F1 | false hits on non-paraphrases |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['threshold']:.2f} | {row['tp']} | {row['fp']} ({row['fp_near']} / {row['fp_other']}) "
              f"| {row['fn']} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} "
              f"| {row['false_hit_rate']:.1%} |")
    good = [row for row in rows if row["precision"] >= TARGET_PRECISION and row["tp"] > 0]
    print()
    if good:
        best = good[0]
        print(f"recommended default threshold: {best['threshold']:.2f} (lowest with precision >= "
              f"{TARGET_PRECISION}: precision {best['precision']:.3f}, recall {best['recall']:.3f})")
    else:
        print(f"precision >= {TARGET_PRECISION} is not reached at any threshold {THRESHOLDS[0]:.2f}-{THRESHOLDS[-1]:.2f}: "
              "keep semantic caching off by default (exact cache only)")
    para = sorted(hit.cosine for hit in hits if hit.right)
    near = sorted((hit.cosine, hit.kind) for hit in hits if hit.label == 0 and hit.own)
    other = max(hit.cosine for hit in hits if not hit.own)
    print(f"top-1 cosine: paraphrases {para[0]:.3f}-{para[-1]:.3f} (median {para[len(para) // 2]:.3f}); "
          f"near misses {near[0][0]:.3f}-{near[-1][0]:.3f} (highest: {near[-1][1]}); "
          f"hits on any other prompt at most {other:.3f}")
    by_kind = Counter(kind for cosine, kind in near if cosine >= 0.9)
    print(f"near misses at cosine >= 0.90 by kind: {dict(by_kind)}\n")


async def latency(index: SemanticIndex, vectors: int, queries: int) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((vectors, 384)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    start = time.perf_counter()
    for number, vector in enumerate(data):
        await index.add("latency", f"v{number}", vector, ttl_s=3600)
    added = time.perf_counter() - start
    probes = rng.standard_normal((queries, 384)).astype(np.float32)
    timings = []
    for vector in probes:
        start = time.perf_counter()
        await index.nearest("latency", vector)
        timings.append(time.perf_counter() - start)
    ms = [t * 1000 for t in timings]
    print(f"VSIM top-1 over {vectors} x 384 (Q8), {queries} queries from Python through SemanticIndex: "
          f"p50 {percentile(ms, 50):.3f} ms, p99 {percentile(ms, 99):.3f} ms "
          f"(VADD: {added / vectors * 1000:.3f} ms each, one at a time)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=Path, default=ROOT / "models" / "semantic-eval" / "pairs.jsonl")
    parser.add_argument("--vectors", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--model", type=Path, default=None, help="ONNX encoder (default: the shipped CPU variant)")
    args = parser.parse_args()
    encoder = EncoderSession(args.model or default_model_path())
    with EmbeddedRedis() as server:
        client = connect(server.url)
        index = SemanticIndex(RedisGuard(client, op_timeout_s=1.0))
        assert await index.detect() == "vectorset", "this Redis has no vector sets"
        await evaluate(index, encoder, load_pairs(args.pairs))
        await latency(index, args.vectors, args.queries)
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main())
