"""Routing quality (issue 9): the classifier against random routing on its held-out labeled set.

    .venv/bin/python bench/routing_quality.py [--no-docs]

Data: models/difficulty/labels/sharegpt-nll.jsonl, rows with split == "heldout" (a hash of the
conversation id, never trained on). Quality: the label is the rank percentile of the small tier's
NLL on the reference answer (1 = the small tier is most surprised by it). We take the small tier's
quality on a prompt as 1 - label and the large tier's as 1 (the reference answer's level: no label
measures the large tier), so sending prompt i to the large tier gains label_i; a second, binary
variant counts a prompt as failed by the small tier when label >= 0.5 ("hard"). Scores: the
classifier's encoder + head (models/difficulty), as `gateway calibrate` scores prompts.
Cost: per 1k requests with the held-out rows' Gemma token counts (prompt, full reference answer)
at routes/local.yaml prices, bands of policies/local.yaml vs always the large tier.
Writes docs/routing-quality.png and the issue-9 routing block of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _load import ROOT, command_line, md_table  # noqa: E402

from gateway.bench.report import replace_marked  # noqa: E402
from gateway.bench.routing import apgr, cost_per_1k, pgr_at, pgr_curve, random_apgr  # noqa: E402
from gateway.classifier.calibrate import score_prompts  # noqa: E402

LABELS = ROOT / "models" / "difficulty" / "labels" / "sharegpt-nll.jsonl"
PLOT = ROOT / "docs" / "routing-quality.png"


def heldout() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in LABELS.read_text(encoding="utf-8").split("\n") if line.strip()]
    return [r for r in rows if r.get("split") == "heldout"]


def prices() -> dict[str, tuple[float, float]]:
    tiers = yaml.safe_load((ROOT / "routes" / "local.yaml").read_text())["tiers"]
    return {t["name"]: (t["prices"]["input_per_mtok"], t["prices"]["output_per_mtok"]) for t in tiers}


def bands() -> tuple[float, str, str]:
    """(cut, small tier, large tier) of policies/local.yaml: score < cut -> small."""
    b = yaml.safe_load((ROOT / "policies" / "local.yaml").read_text())["routing"]["bands"]
    return float(b[0]["below"]), b[0]["tier"], b[-1]["tier"]


def plot(curves: dict[str, tuple[Any, Any]], point: tuple[float, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-docs", action="store_true")
    args = p.parse_args()
    rows = heldout()
    label = np.array([r["label"] for r in rows])
    scores, variant = score_prompts(ROOT / "models" / "difficulty", [r["prompt"] for r in rows], None)
    ones = np.ones_like(label)
    variants = {"continuous (small = 1 - label)": 1 - label,
                "binary (small fails when label ≥ 0.5)": (label < 0.5) * 1.0}
    cut, small, large = bands()
    price = prices()
    table, curves = [], {}
    for name, weak in variants.items():
        share, pgr = pgr_curve(scores, weak, ones)
        oracle = apgr(*pgr_curve(ones - weak, weak, ones))
        at_share, at_pgr = pgr_at(scores, weak, ones, cut)
        table.append([name, f"{apgr(share, pgr):.3f}", f"{random_apgr(weak, ones):.3f}", f"{oracle:.3f}",
                      f"{at_share:.1%} large, PGR {at_pgr:.3f}"])
        curves.setdefault(f"classifier, {name.split(' ')[0]}", (share, pgr))
        if name.startswith("continuous"):
            curves["random (expected)"] = (share, share)
            curves["oracle (sorted by label)"] = pgr_curve(ones - weak, weak, ones)
            point = (at_share, at_pgr)
    plot(curves, point)
    tokens = (np.array([r["prompt_tokens"] for r in rows]), np.array([r["answer_tokens_full"] for r in rows]))
    routed = cost_per_1k(*tokens, scores >= cut, price[small], price[large])
    always = cost_per_1k(*tokens, np.ones(len(rows), bool), price[small], price[large])
    text = (f"`{command_line()}`: {len(rows)} held-out rows, classifier models/difficulty "
            f"(encoder {variant}).\n\n"
            + md_table(["quality", "APGR classifier", "APGR random (200 orders)", "APGR oracle",
                        f"at the calibrated cut (score ≥ {cut:g})"], table)
            + f"\n\nCost per 1k requests (held-out token counts, routes/local.yaml prices): routed by the bands of "
            f"policies/local.yaml **${routed:.4f}**, always `{large}` **${always:.4f}** "
            f"({1 - routed / always:.1%} less). Plot: `docs/{PLOT.name}`.")
    print(text)
    if not args.no_docs:
        replace_marked(ROOT / "docs" / "BENCHMARKS.md", "issue-9-routing", text, heading="### Routing quality")
    return 0


if __name__ == "__main__":
    sys.exit(main())
