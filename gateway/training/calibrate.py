"""Calibration of the difficulty score: `gateway calibrate` (band thresholds).

    gateway calibrate --model models/difficulty --sample 1000 --target small=0.6,medium=0.25,large=0.15
        [--data labeled.jsonl] [--tiers small-int4,medium-int8,large-fp16] [--seed 1]

Thresholds are the score quantiles at the cumulative target shares (RouteLLM's
calibrate_threshold generalized to N tiers, easiest first), so on the sample the given shares of
prompts fall into each band; printed as the policy's `routing:` YAML with the achieved shares.
`--sample 0` reads the held-out score quantiles of thresholds.json instead of scoring prompts.
Offline only (the ShareGPT file); the score's quality metrics are in gateway.training.quality.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from gateway.classifier.difficulty import open_parts
from gateway.classifier.head import log_chars
from gateway.training.embedding import embed_texts
from gateway.training.labeling import sample

F64 = npt.NDArray[np.float64]


def parse_targets(text: str) -> list[tuple[str, float]]:
    """"small=0.6,medium=0.25,large=0.15" -> [(name, share)], easiest first; shares > 0 summing to 1."""
    targets: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not sep or not name.strip() or not 0 < share <= 1:
            raise ValueError(f"--target: cannot parse {part!r}: expected name=share with 0 < share <= 1")
        targets.append((name.strip(), share))
    if len(targets) < 2 or abs(sum(s for _, s in targets) - 1.0) > 1e-6:
        raise ValueError(f"--target: need >= 2 tiers whose shares sum to 1, got {text!r}")
    return targets


def cut_points(scores: npt.ArrayLike, shares: Sequence[float]) -> list[float]:
    """len(shares) - 1 increasing thresholds so ~shares[k] of `scores` fall in band k (score < cut)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if len(s) == 0:
        raise ValueError("no scores to calibrate on")
    cuts: list[float] = []
    cumulative = np.cumsum(shares)[:-1]
    for c in cumulative:
        k = int(round(c * len(s)))
        if k <= 0:
            cut = float(s[0])
        elif k >= len(s):
            cut = float(np.nextafter(s[-1], np.inf))
        else:
            cut = float((s[k - 1] + s[k]) / 2)
            short = round(cut, 4)
            cut = short if s[k - 1] < short <= s[k] else cut
        if cuts and cut <= cuts[-1]:
            cut = float(np.nextafter(cuts[-1], np.inf))
        cuts.append(min(max(cut, 1e-6), 1.0))
    return cuts


def printable(cuts: Sequence[float]) -> list[float]:
    """Cuts rounded to what the YAML shows (6 decimals), kept strictly increasing."""
    out: list[float] = []
    for cut in cuts:
        value = float(_decimal(cut))
        if out and value <= out[-1]:
            value = round(out[-1] + 1e-6, 6)
        out.append(min(max(value, 1e-6), 1.0))
    return out


def achieved_shares(scores: npt.ArrayLike, cuts: Sequence[float]) -> list[float]:
    """Share of `scores` in each band, with a band's upper bound exclusive (as Routing.tier_for)."""
    s = np.asarray(scores, dtype=np.float64)
    below = [float((s < c).mean()) for c in cuts] + [1.0]
    return [b - a for a, b in zip([0.0, *below[:-1]], below, strict=True)]


def cuts_from_quantiles(table: dict[str, float], shares: Sequence[float]) -> list[float]:
    """Cuts by interpolating a {quantile: score} table (thresholds.json) at the cumulative shares."""
    qs = np.array(sorted(float(q) for q in table))
    values = np.array([table[k] for k in sorted(table, key=float)], dtype=np.float64)
    cuts: list[float] = []
    for c in np.cumsum(shares)[:-1]:
        cut = round(float(np.interp(c, qs, values)), 4)
        cuts.append(max(cut, float(np.nextafter(cuts[-1], np.inf))) if cuts else max(cut, 1e-6))
    return cuts


def policy_yaml(model: str, tiers: Sequence[str], cuts: Sequence[float], achieved: Sequence[float] | None,
                targets: Sequence[float]) -> str:
    """The `routing:` block of a policy file, each band commented with its achieved and target share."""
    lines = ["routing:", f"  classifier: {model}", "  bands:"]
    for i, tier in enumerate(tiers):
        band = f"{{below: {_decimal(cuts[i])}, tier: {tier}}}" if i < len(cuts) else f"{{tier: {tier}}}"
        got = f"{achieved[i]:.1%} of the sample, " if achieved is not None else ""
        lines.append(f"    - {band:<40} # {got}target {targets[i]:.1%}")
    return "\n".join(lines)


def _decimal(x: float) -> str:
    """A plain decimal (YAML 1.1 reads `1e-06` as a string): at most 6 places, no trailing zeros."""
    text = f"{x:.6f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def sample_prompts(n: int, seed: int, data: Path | None) -> list[str]:
    """`n` prompts: a seeded sample of the JSONL file's `prompt`s, else of ShareGPT first-turn prompts."""
    if data is not None:
        prompts = [json.loads(line)["prompt"] for line in data.read_text(encoding="utf-8").split("\n") if line.strip()]
        random.Random(seed).shuffle(prompts)
        return prompts[:n]
    return [prompt for _, prompt, _ in sample(seed, n)]


def score_prompts(model: Path, prompts: Sequence[str], variant: str | None) -> tuple[F64, str]:
    """Scores of `prompts` by the model's encoder + head (the serving graphs); and the variant used."""
    encoder, head, chosen, _ = open_parts(model, encoder_variant=variant)
    emb = embed_texts(encoder, prompts, chosen)
    return head.score(emb, log_chars(prompts)).astype(np.float64), chosen


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gateway calibrate", description="Set difficulty bands from target shares.")
    p.add_argument("--model", type=Path, default=Path("models/difficulty"), help="trained difficulty model folder")
    p.add_argument("--sample", type=int, default=1000, help="prompts to score (0: use thresholds.json)")
    p.add_argument("--target", default="small=0.6,medium=0.25,large=0.15", help="name=share,... easiest first")
    p.add_argument("--data", type=Path, default=None, help="JSONL with `prompt` (default: ShareGPT)")
    p.add_argument("--tiers", default=None, help="tier names, easiest first (default: the target names)")
    p.add_argument("--seed", type=int, default=1, help="sampling seed (labels used seed 0)")
    p.add_argument("--encoder-variant", default=None, help="encoder variant (default: the model's)")
    return p


def run_calibrate(argv: Sequence[str] | None = None) -> int:
    """CLI entry of `gateway calibrate`; prints the routing YAML, returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        targets = parse_targets(args.target)
        tiers = [t.strip() for t in args.tiers.split(",")] if args.tiers else [name for name, _ in targets]
        if len(tiers) != len(targets):
            raise ValueError(f"--tiers names {len(tiers)} tiers but --target {len(targets)}")
        shares = [s for _, s in targets]
        if args.sample <= 0:
            table = json.loads((args.model / "thresholds.json").read_text())["quantiles"]
            cuts, achieved, what = printable(cuts_from_quantiles(table, shares)), None, "held-out quantiles in thresholds.json"
        else:
            prompts = sample_prompts(args.sample, args.seed, args.data)
            scores, variant = score_prompts(args.model, prompts, args.encoder_variant)
            cuts = printable(cut_points(scores, shares))
            achieved = achieved_shares(scores, cuts)
            source = f"prompts of {args.data}" if args.data else "ShareGPT first-turn prompts"
            what = f"{len(prompts)} {source} (seed {args.seed}), encoder {variant}"
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"gateway calibrate: {err}", file=sys.stderr)
        return 2
    print(f"# calibrated on {what}")
    print(policy_yaml(str(args.model), tiers, cuts, achieved, shares))
    if achieved is not None:
        got = ", ".join(f"{t}={a:.3f}" for t, a in zip(tiers, achieved, strict=True))
        print(f"achieved shares: {got}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_calibrate(argv)


if __name__ == "__main__":
    sys.exit(main())
