"""Escalate: an answer whose confidence is low goes to the next tier up (issue 39). The decision, pure.

Per tenant, `escalate: {min_confidence: C, measure?, hold_tokens: K?}`. A non-streamed request of one output
without tools (`armed`) asks its tier for token log-probabilities (`ask_logprobs`: chat `logprobs: true,
top_logprobs: 1`, completions `logprobs: 1`; the client's own settings kept when it asked); the answer's
`confidence` is the geometric mean of its tokens' probabilities, exp(mean logprob), in [0, 1] (or, `measure:
least_token`, its least likely token's probability: better on short answers, docs/BENCHMARKS.md). Below C
(`escalates`: exactly C is confident enough) the request goes to `next_tier`, the next tier up in routes order
the tenant may use (same endpoint), and that answer is returned (gateway.upstream.escalate). An answer without log-probabilities
(a backend that sends none, an empty answer) has no confidence and is kept. A stream escalates only when the
tenant sets `hold_tokens: K`: its first K tokens are held (not sent), their confidence decides, then it streams
from the tier that keeps it (gateway.upstream.escalate, gateway.upstream.held).

Every decision is logged (`escalation`: the confidence, the rule, the outcome, when it was made); an escalated
answer's both parts are priced: `Escalation` keeps the first part (tier, replica, tokens, confidence);
accounting adds its cost (`first_cost`) and the log line's `escalated_from` and `escalation` (`log_fields`).
"""

from __future__ import annotations

import math
from datetime import date
from typing import Any

from gateway.config import Tier
from gateway.config.policies import Escalate
from gateway.context import RequestContext
from gateway.protocols.native import is_native
from gateway.routing.decision import Escalation as Escalation  # defined beside the route's record (no import circle)


def armed(ctx: RequestContext) -> Escalate | None:
    """The tenant's escalate rule when this request may escalate: not streamed (a stream only with hold_tokens),
    one output (not n > 1, best_of, prompt lists), no tools or functions offered, chat or completions on a tier
    not serving the protocol natively, not escalated already, and a tier above it the tenant may use."""
    tenant, reading = ctx.tenant, ctx.reading
    if tenant is None or tenant.escalate is None or reading is None or ctx.route.tier is None:
        return None
    if ctx.stream and tenant.escalate.hold_tokens is None:
        return None
    if ctx.endpoint not in ("chat", "completions") or reading.generated != 1 or ctx.escalation is not None:
        return None
    if any(part.role == "tools" for part in reading.parts) or ctx.body.get("functions") or is_native(ctx):
        return None
    return tenant.escalate if next_tier(ctx) is not None else None


def next_tier(ctx: RequestContext) -> Tier | None:
    """The first tier after the request's in routes order serving its endpoint that the tenant may use."""
    tiers, tier = ctx.config.routes.tiers, ctx.route.tier
    if tier is None or tier not in tiers:
        return None
    for later in tiers[tiers.index(tier) + 1:]:
        if later.endpoint == tier.endpoint and not later.embedder and (
                ctx.tenant is None or ctx.tenant.allows(later.name)):
            return later
    return None


def client_asked(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether the client asked for log-probabilities itself (then its answer keeps them)."""
    value = body.get("logprobs")
    return value is True if endpoint == "chat" else isinstance(value, int) and not isinstance(value, bool)


def ask_logprobs(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The upstream body asking for each token's log-probability (the client's own request for them stands)."""
    if client_asked(endpoint, body):
        return body
    if endpoint == "chat":  # llama.cpp sends none with top_logprobs 0: one alternative, the token itself
        return {**body, "logprobs": True, "top_logprobs": 1}
    return {**body, "logprobs": 1}


def token_logprobs(choice: dict[str, Any]) -> list[float] | None:
    """A choice's tokens' log-probabilities: OpenAI chat's `logprobs.content[].logprob` (llama.cpp also sends it
    for completions) or completions' `logprobs.token_logprobs` (vLLM, OpenAI); None when it has none."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    values: list[Any]
    if isinstance(content, list):
        values = [entry.get("logprob") if isinstance(entry, dict) else None for entry in content]
    elif isinstance(listed := logprobs.get("token_logprobs"), list):
        values = listed
    else:
        return None
    out = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v]
    return out or None


def confidence(logprobs: list[float] | None, measure: str = "geometric_mean") -> float | None:
    """The geometric mean of the tokens' probabilities, exp(mean logprob), in [0, 1] (`least_token`: the least
    likely token's probability, exp(min logprob)); None without tokens. A -inf logprob (probability 0) gives 0;
    a positive one (rounding) counts as 0 (probability 1)."""
    if not logprobs:
        return None
    if measure == "least_token":
        least = min(min(0.0, lp) for lp in logprobs)
        return 0.0 if least == -math.inf else math.exp(least)
    mean = sum(min(0.0, lp) for lp in logprobs) / len(logprobs)
    return 0.0 if mean == -math.inf else math.exp(mean)


def escalates(value: float | None, rule: Escalate) -> bool:
    """Below the tenant's minimum confidence; exactly at it is confident enough; no confidence: kept."""
    return value is not None and value < rule.min_confidence


def strip_logprobs(answer: dict[str, Any]) -> None:
    """The client did not ask for log-probabilities: its answer carries none (`logprobs: null`, as OpenAI's)."""
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict) and "logprobs" in choice:
            choice["logprobs"] = None


def first_cost(ctx: RequestContext, day: date, tier: Tier | None = None) -> float:
    """The first part's cost at `tier`'s prices (its own tier's unless told; the baseline's for baseline_cost)."""
    first = ctx.escalation
    if first is None or first.outcome != "escalated":
        return 0.0
    return (tier or first.from_tier).price_at(day).cost_usd(first.prompt_tokens, first.completion_tokens,
                                                           first.cached_tokens)


def log_fields(ctx: RequestContext, day: date, cost: float) -> dict[str, Any]:
    """The log line's `escalated_from` and `escalation`: the confidence, the rule, and both parts priced on their
    own tiers (`cost`: the request's, both parts; the second, the answer returned, costs the rest). An escalation
    whose second tier failed says so (`outcome`); the first answer was returned and is the only part."""
    first = ctx.escalation
    if first is None:
        return {"escalated_from": None, "escalation": None}
    before = first_cost(ctx, day)
    served_cost = round(cost - before, 12)
    part = {"tier": first.from_tier.name, "replica": first.from_replica, "prompt_tokens": first.prompt_tokens,
            "completion_tokens": first.completion_tokens, "cost_usd": before}
    report: dict[str, Any] = {
        "confidence": None if first.confidence is None else round(first.confidence, 4),
        "min_confidence": first.rule.min_confidence, "outcome": first.outcome, "decided_ms": first.first_ms}
    if ctx.stream:
        report["hold_tokens"] = first.rule.hold_tokens
    if first.outcome == "escalated":
        report["parts"] = [part, {
            "tier": ctx.route.tier.name if ctx.route.tier else None, "replica": ctx.upstream.replica.name if ctx.upstream.replica else None,
            "prompt_tokens": ctx.upstream.prompt_tokens or 0, "completion_tokens": ctx.upstream.completion_tokens or 0,
            "cost_usd": served_cost}]
    return {"escalated_from": first.from_tier.name if first.outcome == "escalated" else None, "escalation": report}
