"""`gateway train --from-outcomes FILE... [--out models/router]`: fit the quality router (models/router's kind)
on measured outcomes: the public JSONL shape of ../shared/outcomes/ (prompt, per-model scores in [0, 1], optional cost),
the gateway's own shadow pairs (`--shadow-pairs` of `gateway serve`) and its `/v1/feedback` (the `feedback`
lines of the request log), in any mix (gateway.training.traffic_outcomes tells the lines apart).

    gateway train --from-outcomes ../shared/outcomes/*.jsonl --out models/router --force   # the shipped one
    gateway train --from-outcomes .gateway/shadow-pairs.jsonl requests.log --routes routes/local.yaml --out DIR

Traffic names a tier; the router predicts for measured models: `--routes` maps each tier to its quality_model
(a tier without one keeps its name, so set `quality_model: <tier name>` to route on a router fitted on traffic
alone). Exit status: 0 done, 2 bad arguments or data.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.training.traffic_outcomes import read_mixed


def parser() -> argparse.ArgumentParser:
    """The router's own options (gateway.training.router_train), and how traffic is read."""
    from gateway.training.router_train import parser as router_parser

    p = router_parser()
    for action in p._actions:
        if action.dest == "files":
            action.help = ("JSONL files in any mix: outcome rows ({prompt, scores: {model: score in [0, 1]}}), shadow "
                           "pairs, request logs with /v1/feedback lines")
    p.description = ("Fit the quality router on measured outcomes, shadow pairs and feedback (`gateway train --help` "
                     "lists the other ways in). FILEs: outcome rows ({prompt, scores: {model: score}}), shadow pairs, "
                     "request logs with feedback lines, in any mix.")
    p.add_argument("--routes", type=Path, default=None, metavar="FILE",
                   help="name traffic's tiers by their quality_model in this routes file (default: none, a tier "
                        "keeps its own name)")
    return p


def tier_models(routes: Path | None) -> dict[str, str]:
    """tier name -> quality_model of the routes file (empty without one)."""
    if routes is None:
        return {}
    from gateway.config.loader import load_routes

    return {t.name: t.quality_model for t in load_routes(routes).tiers if t.quality_model}


def router_options(args: argparse.Namespace) -> dict[str, Any]:
    """train_router's keyword arguments from the router's own options (gateway.training.router_train.parser)."""
    options = {"l2": args.l2, "cache_dir": args.embed_cache, "difficulty_dir": args.difficulty, "paths": args.files,
               "threads": args.threads}
    if hasattr(args, "gate"):
        options["gate_h0"] = args.gate
    if hasattr(args, "alpha"):
        options["alpha"] = args.alpha
    return options


def run_from_outcomes(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from gateway.training.router_train import shipped_router_refusal

    if (refusal := shipped_router_refusal(args.out, args.force)) is not None:
        print(f"gateway train --from-outcomes: {refusal}", file=sys.stderr)
        return 2
    from gateway.config import ConfigError

    try:
        rows, counts = read_mixed(args.files, tier_models(args.routes))
    except ConfigError as err:
        print("\n".join(str(i) for i in err.issues), file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:
        print(f"gateway train --from-outcomes: {err}", file=sys.stderr)
        return 2
    print(f"read {counts.summary()}")
    if not rows:
        print("gateway train --from-outcomes: no rows to train on", file=sys.stderr)
        return 2
    sources = Counter(r.source for r in rows)
    print(f"fitting on all {len(rows)} rows (measure on held-out data with bench/routing_outcomes.py); by source: "
          + ", ".join(f"{name} {n}" for name, n in sources.most_common()))
    from gateway.training.router_train import train_router

    try:
        metrics = train_router(rows, args.out, **router_options(args))
    except (OSError, ValueError) as err:
        print(f"gateway train --from-outcomes: {err}", file=sys.stderr)
        return 2
    print(f"fitted {len(metrics['models'])} model outputs in {metrics['training']['seconds']} s -> {args.out}")
    return 0
