"""The gateway's own traffic as measured outcomes: shadow pairs and `/v1/feedback` turned into OutcomeRows, so
`gateway train --from-outcomes` retrains the router on a deployment's traffic with the public outcomes' code.

    rows, counts = read_mixed([Path(".gateway/shadow-pairs.jsonl"), Path("requests.log"), Path("outcomes.jsonl")],
                              tier_models={"small-q4": "mistral-7b-instruct-v0.3", ...})

Each line of each file is told apart by its fields:
- an outcome row (`scores`): as gateway.training.outcomes reads it;
- a shadow pair (`from_tier`, `to_tier`, `prompt`; gateway.experiments.shadow.ShadowPair): the reference tier
  is the yardstick, so it scores 1 and the `from` tier scores the pair's judge grade when there is one, else
  the answers' agreement (cosine of their sentence embeddings, clipped to [0, 1]);
- a feedback line (`"event": "feedback"` in the request log, plain or gzip'd, or a stored feedback:
  `request_id`, `tier`, `score`): the application's score for the answer of that tier. Feedback carries no
  prompt: it takes the prompt of the shadow pair of the same request, or a `prompt` field an application added
  to its own export; feedback without either is counted and left out. One feedback per request id counts:
  the last (by its `ts`, then by reading order), as the gateway stores it (issue 37);
- anything else (the request log's other lines) is skipped.
A tier is named by the measured model that stands for it (`tier_models`: the routes file's quality_model), so
the fitted router predicts for the names the routes file routes on; a tier without one keeps its own name.
Traffic rows of the same prompt (normalized text) become one row, each model's scores averaged per tenant
first and then across tenants: every tenant that labelled a prompt weighs the same, however many labels it
sent (one tenant's feedback cannot outweigh another tenant's data for the same prompt).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from gateway.accounting.reader import open_log
from gateway.training.outcomes import HELDOUT_SHARE, OutcomeRow, hash_split, parse_row, text_key

TRAFFIC_TASK = "traffic"


@dataclass(slots=True)
class TrafficCounts:
    outcome_rows: int = 0  # public-shape rows, read as they are
    shadow_pairs: int = 0  # pairs used
    feedback: int = 0  # feedback used
    feedback_without_prompt: int = 0  # no shadow pair and no `prompt`: left out
    feedback_replaced: int = 0  # earlier feedback on a request id that a later one replaced: left out
    without_signal: int = 0  # shadow pairs whose reference failed (no agreement, no grade)
    malformed: int = 0  # lines that are not JSON objects (a torn last line, ...)
    other: int = 0  # lines of none of the three kinds (request lines of a log)
    by_file: dict[str, int] = field(default_factory=dict)  # rows taken per file

    def summary(self) -> str:
        return (f"{self.outcome_rows} outcome rows, {self.shadow_pairs} shadow pairs, {self.feedback} feedback "
                f"({self.feedback_without_prompt} feedback without a prompt, {self.feedback_replaced} replaced by a "
                f"later one on the same request, {self.without_signal} pairs without a "
                f"signal, {self.malformed} malformed and {self.other} other lines left out)")


@dataclass(slots=True)
class _Prompt:
    """What the traffic said about one prompt: scores per model per tenant, and where they came from."""

    prompt: str
    task: str
    scores: dict[str, dict[str, list[float]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    sources: set[str] = field(default_factory=set)


def pair_scores(pair: Mapping[str, Any], tier_models: Mapping[str, str]) -> dict[str, float] | None:
    """{from model: grade or agreement, reference model: 1.0}; None when the pair has no usable signal."""
    signal = next((float(v) for v in (pair.get("judge_score"), pair.get("agreement")) if _number(v)), None)
    weak, strong = _model(pair["from_tier"], tier_models), _model(pair["to_tier"], tier_models)
    if signal is None or weak == strong:
        return None
    return {weak: min(1.0, max(0.0, signal)), strong: 1.0}


def is_feedback(row: Mapping[str, Any]) -> bool:
    if row.get("event") not in (None, "feedback"):
        return False
    return isinstance(row.get("request_id"), str) and isinstance(row.get("tier"), str) and _number(row.get("score"))


def read_mixed(paths: Iterable[Path], tier_models: Mapping[str, str] | None = None,
               heldout_share: float = HELDOUT_SHARE) -> tuple[list[OutcomeRow], TrafficCounts]:
    """Outcome rows of every file (public rows as they are, then one row per prompt of the traffic);
    ValueError naming file:line for a public-shape row that is wrong."""
    models = dict(tier_models or {})
    counts = TrafficCounts()
    public: list[OutcomeRow] = []
    traffic: dict[str, _Prompt] = {}
    prompts_by_request: dict[str, str] = {}
    feedback: dict[tuple[str, str], tuple[tuple[str, int], str, dict[str, Any]]] = {}  # the last per request id
    seq = 0
    for path in paths:
        for n, row in _objects(path, counts):
            where = f"{path}:{n}"
            if "scores" in row:
                public.append(parse_row(row, where, heldout_share))
                counts.outcome_rows += 1
                counts.by_file[str(path)] = counts.by_file.get(str(path), 0) + 1
            elif {"from_tier", "to_tier"} <= row.keys() and isinstance(row.get("prompt"), str) and row["prompt"]:
                if isinstance(row.get("request_id"), str):
                    prompts_by_request[row["request_id"]] = row["prompt"]
                scores = pair_scores(row, models)
                if scores is None:
                    counts.without_signal += 1
                    continue
                _add(traffic, row["prompt"], str(row.get("tenant") or TRAFFIC_TASK), scores, "shadow")
                counts.shadow_pairs += 1
                counts.by_file[str(path)] = counts.by_file.get(str(path), 0) + 1
            elif is_feedback(row):
                seq += 1
                key, order = (str(row.get("tenant")), row["request_id"]), (str(row.get("ts") or ""), seq)
                earlier = feedback.get(key)
                if earlier is not None:
                    counts.feedback_replaced += 1
                if earlier is None or order >= earlier[0]:
                    feedback[key] = (order, str(path), row)
            else:
                counts.other += 1
    for _, path_name, row in feedback.values():  # after every file: a pair may come after its feedback
        prompt = row.get("prompt") if isinstance(row.get("prompt"), str) else prompts_by_request.get(row["request_id"])
        if not prompt:
            counts.feedback_without_prompt += 1
            continue
        score = min(1.0, max(0.0, float(row["score"])))
        _add(traffic, prompt, str(row.get("tenant") or TRAFFIC_TASK), {_model(row["tier"], models): score}, "feedback")
        counts.feedback += 1
        counts.by_file[path_name] = counts.by_file.get(path_name, 0) + 1
    return public + [_row(key, seen, heldout_share) for key, seen in traffic.items()], counts


def _objects(path: Path, counts: TrafficCounts) -> Iterable[tuple[int, dict[str, Any]]]:
    """The JSON objects of a file, line by line (a rotated request log may be gzip'd)."""
    with open_log(path) as stream:
        for n, line in enumerate(stream, 1):  # bytes: split at \n only (prompts hold U+2028)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                counts.malformed += 1
                continue
            if isinstance(row, dict):
                yield n, row
            else:
                counts.malformed += 1


def _add(traffic: dict[str, _Prompt], prompt: str, tenant: str, scores: Mapping[str, float], source: str) -> None:
    """One label set for `prompt` from `tenant` (the first tenant seen names the row's task)."""
    seen = traffic.setdefault(text_key(prompt), _Prompt(prompt, tenant))
    for model, score in scores.items():
        seen.scores[model][tenant].append(score)
    seen.sources.add(source)


def _row(key: str, seen: _Prompt, heldout_share: float) -> OutcomeRow:
    scores = {model: _tenant_mean(by_tenant) for model, by_tenant in seen.scores.items()}
    return OutcomeRow(id=f"traffic/{key[:16]}", source="+".join(sorted(seen.sources)), task=seen.task,
                      prompt=seen.prompt, scores=scores, cost_usd=None, split=hash_split(seen.prompt, heldout_share))


def _tenant_mean(by_tenant: Mapping[str, list[float]]) -> float:
    """The mean over tenants of each tenant's mean: every tenant weighs the same."""
    means = [sum(values) / len(values) for values in by_tenant.values() if values]
    return sum(means) / len(means)


def _model(tier: Any, tier_models: Mapping[str, str]) -> str:
    return tier_models.get(str(tier), str(tier))


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
