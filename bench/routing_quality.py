"""Routing quality: the classifier against random routing on the held-out split of the rubric label.

    .venv/bin/python bench/routing_quality.py [--no-docs]

Data: models/difficulty/labels/rubric.jsonl, rows with split == "heldout" (a hash of the
conversation or prompt id, never trained on): ShareGPT first turns and written prompts, each with
a rubric level 1-5 (models/difficulty/labels/RUBRIC.md). No label measures either tier's answers, so
the large tier's quality is 1 on every prompt and the small tier's is read off the level:
- binary: the small tier fails (0) on hard prompts (level >= 4) and matches the large one (1) below;
- graded: each level above 1 costs the small tier a quarter of the gap, small = 1 - (level - 1) / 4.
APGR (RouteLLM: area under PGR over the share sent to the large tier; random 0.5), CPT(50 %) and
CPT(80 %) (the smallest large-tier share whose PGR reaches 50 % / 80 %), for the classifier, random
routing, `log_chars` alone and the oracle. Scores: the classifier's encoder + head (models/difficulty),
as `gateway calibrate` scores prompts. Cost per 1k requests on the held-out rows with Gemma token
counts (the NLL subset: prompt and full reference answer) at routes/local.yaml prices, bands of
policies/local.yaml vs always the large tier.
Writes docs/routing-quality.png and the routing block of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gateway.bench.report import ROOT, command_line, md_table, pyplot, replace_marked
from gateway.bench.routing import apgr, cost_per_1k, cpt, pgr_at, pgr_curve, random_apgr
from gateway.classifier.head import log_chars
from gateway.training.calibrate import score_prompts
from gateway.training.rubric import HARD_LEVEL

LABELS = ROOT / "models" / "difficulty" / "labels" / "rubric.jsonl"
NLL = ROOT / "models" / "difficulty" / "labels" / "sharegpt-nll.jsonl"
PLOT = ROOT / "docs" / "routing-quality.png"


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


def heldout() -> list[dict[str, Any]]:
    return [r for r in read(LABELS) if r.get("split") == "heldout"]


def prices() -> dict[str, tuple[float, float]]:
    tiers = yaml.safe_load((ROOT / "routes" / "local.yaml").read_text())["tiers"]
    return {t["name"]: (t["prices"]["input_per_mtok"], t["prices"]["output_per_mtok"]) for t in tiers}


def bands() -> tuple[float, str, str]:
    """(cut, small tier, large tier) of policies/local.yaml: score < cut -> small."""
    b = yaml.safe_load((ROOT / "policies" / "local.yaml").read_text())["routing"]["bands"]
    return float(b[0]["below"]), b[0]["tier"], b[-1]["tier"]


def plot(curves: dict[str, tuple[Any, Any]], point: tuple[float, float]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.6, 3.6), dpi=80)
    for name, (share, pgr) in curves.items():
        ax.plot(share, pgr, label=name, lw=1.5 if name.startswith("classifier") else 1)
    ax.plot(*point, "ko", label=f"policies/local.yaml cut ({point[0]:.0%} large)")
    ax.set_xlabel("share of requests sent to the large tier")
    ax.set_ylabel("performance gap recovered (PGR)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT)
    plt.close(fig)


def row_of(name: str, scores: Any, weak: Any, ones: Any) -> list[str]:
    share, pgr = pgr_curve(scores, weak, ones)
    return [name, f"{apgr(share, pgr):.3f}", f"{cpt(share, pgr, 0.5):.1%}", f"{cpt(share, pgr, 0.8):.1%}"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    rows = heldout()
    level = np.array([r["level"] for r in rows])
    scores, variant = score_prompts(ROOT / "models" / "difficulty", [r["prompt"] for r in rows], None)
    lengths = log_chars([r["prompt"] for r in rows]).reshape(-1).astype(np.float64)
    ones = np.ones(len(rows))
    variants = {"binary": (level < HARD_LEVEL) * 1.0, "graded": 1 - (level - 1) / 4}
    cut, small, large = bands()
    table, curves = [], {}
    for name, weak in variants.items():
        share, pgr = pgr_curve(scores, weak, ones)
        at_share, at_pgr = pgr_at(scores, weak, ones, cut)
        rng = np.random.default_rng(0)
        table += [row_of(f"{name}: classifier", scores, weak, ones) + [f"{at_share:.1%} large, PGR {at_pgr:.3f}"],
                  [f"{name}: random (200 orders)", f"{random_apgr(weak, ones):.3f}",
                   f"{np.mean([cpt(*pgr_curve(rng.permutation(len(rows)), weak, ones), 0.5) for _ in range(200)]):.1%}",
                   f"{np.mean([cpt(*pgr_curve(rng.permutation(len(rows)), weak, ones), 0.8) for _ in range(200)]):.1%}", ""],
                  row_of(f"{name}: log_chars alone", lengths, weak, ones) + [""],
                  row_of(f"{name}: oracle (by level)", ones - weak, weak, ones) + [""]]
        curves[f"classifier, {name}"] = (share, pgr)
        if name == "binary":
            curves["random (expected)"] = (share, share)
            curves["oracle, binary"] = pgr_curve(ones - weak, weak, ones)
            point = (at_share, at_pgr)
    plot(curves, point)
    text = (f"`{command_line()}`: {len(rows)} held-out rows of models/difficulty/labels/rubric.jsonl "
            f"({sum(r['source'] == 'sharegpt' for r in rows)} ShareGPT, {sum(r['source'] == 'written' for r in rows)} written; "
            f"{int((level >= HARD_LEVEL).sum())} hard), classifier models/difficulty (encoder {variant}).\n\n"
            + md_table(["router", "APGR", "CPT(50%)", "CPT(80%)", f"at the policies/local.yaml cut (score ≥ {cut:g})"], table)
            + "\n\n" + cost_text(rows, scores, cut, small, large) + f" Plot: `docs/{PLOT.name}`.")
    print(text)
    if not args.no_docs:
        replace_marked(ROOT / "docs" / "BENCHMARKS.md", "issue-9-routing", text, heading="### Routing quality")
    return 0


def cost_text(rows: list[dict[str, Any]], scores: Any, cut: float, small: str, large: str) -> str:
    """Cost per 1k requests on the held-out rows that have Gemma token counts (the NLL subset)."""
    tokens = {r["id"]: (r["prompt_tokens"], r["answer_tokens_full"]) for r in read(NLL)}
    known = np.array([r["id"] in tokens for r in rows])
    prompt = np.array([tokens[r["id"]][0] for r in rows if r["id"] in tokens])
    answer = np.array([tokens[r["id"]][1] for r in rows if r["id"] in tokens])
    price = prices()
    routed = cost_per_1k(prompt, answer, scores[known] >= cut, price[small], price[large])
    always = cost_per_1k(prompt, answer, np.ones(len(prompt), bool), price[small], price[large])
    return (f"Cost per 1k requests ({int(known.sum())} held-out rows with Gemma token counts, routes/local.yaml prices): "
            f"routed by the bands of policies/local.yaml **${routed:.4f}**, always `{large}` **${always:.4f}** "
            f"({1 - routed / always:.1%} less).")


if __name__ == "__main__":
    sys.exit(main())
