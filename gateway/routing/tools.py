"""The quality predictor outside the request path: loading it for `gateway serve | up | route explain`, and
`gateway route score IN.jsonl OUT.jsonl` (each prompt's predicted quality per tier and its `gain`).

    gateway route score prompts.jsonl scored.jsonl [--routes routes/local.yaml] [--predictor models/router]

In: one JSON object a line, `{"id": ..., "prompt": "..."}` (`id` optional: the line number stands in). Out: one
line per prompt, `{"id", "quality": {tier: predicted score}, "gain"}` where `gain` is the dearest tier's
predicted quality minus the cheapest's for that prompt (prices of its tokens plus --max-tokens; higher: more
need for the dearest tier), so thresholds can be swept with any outside tool. The tiers are the routes file's
chat tiers with a `quality_model` the predictor knows. With `--floors 0.02,0.05` it prints, per floor, the share
of the prompts each tier would get and the mean predicted quality kept: how a policy's quality_floor is
calibrated on a sample of your prompts. Exit status: 0 done, 2 bad input or no predictor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.backends.stats import estimate_tokens
from gateway.routing.quality import TierOption, choose, gain, tier_options

if TYPE_CHECKING:
    from gateway.config import GatewayConfig, RoutesConfig
    from gateway.types import DifficultyScorer, QualityPredictor

REPOSITORY = Path(__file__).resolve().parents[2]
SCORE_BATCH = 64  # prompts predicted at once (the predictor's micro-batcher groups them)


def model_folder(path: str | Path) -> Path:
    """A model folder as the policy names it: as given when it exists, else relative to the repository."""
    folder = Path(path)
    return folder if folder.is_absolute() or folder.exists() else REPOSITORY / folder


def load_predictor(folder: Path, scorer: DifficultyScorer | None = None) -> QualityPredictor:
    """The predictor in `folder`, sharing the difficulty classifier's embeddings when it reads the same encoder
    (one encoding per prompt for both), else on an encoder of its own. Raises when it cannot be loaded."""
    from gateway.classifier.difficulty import DifficultyClassifier, EncoderMismatch
    from gateway.classifier.quality import load_quality_predictor

    if isinstance(scorer, DifficultyClassifier):
        try:
            return load_quality_predictor(folder, embedder=scorer.embedder)
        except EncoderMismatch:
            pass
    return load_quality_predictor(folder)


def serving_predictor(config: GatewayConfig, scorer: DifficultyScorer | None) -> QualityPredictor | None:
    """The predictor the policy's quality_floor needs (None when no tenant or arm routes by quality, or when it
    cannot be loaded: those tenants then route by their bands). Says on stderr what it loaded and which tiers
    it cannot predict for."""
    from gateway.config.tenants import routes_by_quality

    tenants = [*config.tenants_by_key_hash.values(), *([config.anonymous] if config.anonymous else [])]
    if not routes_by_quality(tenants):
        return None
    folder = model_folder(config.policy.quality_predictor)
    try:
        predictor = load_predictor(folder, scorer)
    except (OSError, ValueError) as err:
        print(f"quality predictor {folder} not loaded ({err}): tenants with quality_floor route by their bands "
              "(or the default tier)", file=sys.stderr)
        return None
    print(f"quality predictor {folder}: {len(predictor.models)} models", file=sys.stderr)
    for line in unknown_models(config.routes, predictor):
        print(line, file=sys.stderr)
    return predictor


def unknown_models(routes: RoutesConfig, predictor: QualityPredictor) -> list[str]:
    """One line per chat tier whose quality_model the predictor does not know (quality routing leaves it out)."""
    known = set(predictor.models)
    return [f"routes: tiers[{i}].quality_model: {t.quality_model!r} is not a model the quality predictor knows "
            f"({', '.join(sorted(known))}); tier {t.name} is left out of quality routing"
            for i, t in enumerate(routes.tiers) if t.endpoint == "chat" and t.quality_model
            and t.quality_model not in known]


def read_prompts(path: Path) -> list[tuple[Any, str]]:
    """(id, prompt) per line; ValueError naming file:line for a line that is not {"prompt": string, ...}."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):  # prompts may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{n}: a line needs a string `prompt` (and an `id`)")
        out.append((row.get("id", n), row["prompt"]))
    return out


def prompt_options(predictions: Sequence[dict[str, float]], prompts: Sequence[tuple[Any, str]], routes: RoutesConfig,
                   completion_tokens: int) -> list[list[TierOption]]:
    """Each prompt's tiers with their predicted quality and price, cheapest first."""
    day = datetime.now(UTC).date()
    return [tier_options(predicted, routes.tiers, prompt_tokens=estimate_tokens(len(prompt)),
                         completion_tokens=completion_tokens, day=day)
            for (_, prompt), predicted in zip(prompts, predictions, strict=True)]


def score_rows(options: Sequence[Sequence[TierOption]], prompts: Sequence[tuple[Any, str]],
               routes: RoutesConfig) -> list[dict[str, Any]]:
    """The output lines: each tier's predicted quality (the routes file's order) and the gain."""
    rows = []
    for (key, _), choices in zip(prompts, options, strict=True):
        by_tier = {o.tier: round(o.quality, 6) for o in choices}
        value = gain(choices)
        rows.append({"id": key, "quality": {t.name: by_tier[t.name] for t in routes.tiers if t.name in by_tier},
                     "gain": None if value is None else round(value, 6)})
    return rows


def sweep(options: Sequence[Sequence[TierOption]], floors: Sequence[float]) -> list[str]:
    """Per floor: the share of the prompts each tier would get, and the mean predicted quality of the choices
    against sending every prompt to the cheapest and to the dearest tier (a floor's calibration)."""
    usable = [o for o in options if len(o) >= 2]
    if not usable:
        return []
    cheapest = sum(o[0].quality for o in usable) / len(usable)
    dearest = sum(o[-1].quality for o in usable) / len(usable)
    lines = [f"{len(usable)} prompts: mean predicted quality {cheapest:.4f} all on the cheapest tier, "
             f"{dearest:.4f} all on the dearest"]
    for floor in floors:
        chosen = [c.chosen for c in (choose(o, floor) for o in usable) if c is not None]
        mean = sum(c.quality for c in chosen) / len(chosen)
        shares = Counter(c.tier for c in chosen)
        kept = (mean - cheapest) / (dearest - cheapest) if dearest != cheapest else 1.0
        lines.append(f"floor {floor:g}: " + ", ".join(f"{tier} {n / len(chosen):.1%}" for tier, n in
                                                      sorted(shares.items(), key=lambda kv: -kv[1]))
                     + f"; mean predicted quality {mean:.4f} ({kept:.1%} of the dearest tier's gain kept)")
    return lines


async def predict_all(predictor: QualityPredictor, texts: Sequence[str], batch: int = SCORE_BATCH
                      ) -> list[dict[str, float]]:
    """Predictions for `texts`, `batch` at a time (in one call where the predictor takes many)."""
    many = getattr(predictor, "predict_many", None)
    out: list[dict[str, float]] = []
    for start in range(0, len(texts), batch):
        part = texts[start:start + batch]
        out += await many(part) if many is not None else await asyncio.gather(*(predictor.predict(t) for t in part))
    return out


def run_score(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError
    from gateway.config.loader import load_routes

    try:
        routes = load_routes(args.routes)
    except ConfigError as err:
        print("\n".join(str(i) for i in err.issues), file=sys.stderr)
        return 2
    try:
        prompts = read_prompts(args.input)
        predictor = load_predictor(model_folder(args.predictor))
    except (OSError, ValueError) as err:
        print(f"gateway route score: {err}", file=sys.stderr)
        return 2
    try:
        tiers = [t.name for t in routes.tiers if t.endpoint == "chat" and t.quality_model in predictor.models]
        for line in unknown_models(routes, predictor):
            print(line, file=sys.stderr)
        if len(tiers) < 2:
            print(f"gateway route score: {args.routes} has {len(tiers)} chat tier(s) with a quality_model the "
                  "predictor knows: the gain needs two", file=sys.stderr)
            return 2
        predictions = asyncio.run(predict_all(predictor, [p for _, p in prompts]))
    finally:
        predictor.close()
    options = prompt_options(predictions, prompts, routes, args.max_tokens)
    rows = score_rows(options, prompts, routes)
    args.output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"scored {len(rows)} prompts over tiers {', '.join(tiers)} -> {args.output}", file=sys.stderr)
    for line in sweep(options, args.floors):
        print(line)
    return 0
