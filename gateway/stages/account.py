"""Account: settle the token counts, price the request, and write its one log line and metrics.

Runs for every request that reached the gateway, whatever happened: first of `RequestPath.finish`.

Work done is priced (issue 37), and the log line's `priced_from` says from what (`PRICED_FROM`): the
backend's usage; the gateway's counts (the tier's tokenizer for the prompt, the stream's content chunks or
the answer's text); or, for a client that left before the answer came, the prompt counted and the output
estimated from the replica's decode rate (`gateway.upstream.sink.price_abandoned`). None: no backend
did any work for the request (refused, a cache hit, every attempt failed), and it costs nothing.
"""

from __future__ import annotations

import time
from datetime import date
from typing import Any

from gateway.accounting.log import bounded, log_request
from gateway.clock import iso_ms, utc_day
from gateway.config import GatewayConfig, Tier
from gateway.config.routes import nano_usd
from gateway.config.tokenizers import build_counters
from gateway.context import RequestContext
from gateway.dashboard.window import meets_slo
from gateway.metrics import GatewayMetrics
from gateway.routing.escalate import first_cost, log_fields as escalation_fields
from gateway.upstream.resume import priced_parts
from gateway.tokens import TokenCounters
from gateway.whatif.logline import replay_fields

PRICED_FROM = {
    "backend_usage": "the backend's usage (prompt and completion tokens it reported)",
    "counted": "the gateway's counts: the prompt by the tier's tokenizer, the output by stream chunks or text",
    "estimated_decode_rate": "the client left first: prompt counted, output from the replica's measured TPOT",
    "prompt_only": "the client left first: prompt counted, no output (none came, or no decode rate measured)",
}
NO_ARM: dict[str, Any] = {"experiment": None, "arm": None, "arm_control": None}  # not in an experiment (issue 22)


class Accountant:
    def __init__(self, counters: TokenCounters, metrics: GatewayMetrics) -> None:
        self._counters = counters
        self.counters = counters  # the tiers' token counters (a resumed stream counts the tokens it sent)
        self._metrics = metrics

    def prepare(self, config: GatewayConfig) -> None:
        """Load the token counters a config's tiers name (slow: at start and on reload, never per request);
        a tokenizer that does not load raises a ConfigError naming its tier (the reload refuses the version)."""
        build_counters(config.routes, self._counters)

    def settle(self, ctx: RequestContext, observe: bool = True) -> None:
        """Price the request and write its line; `observe` False: the line only, not the serving metrics and
        dashboard (an answer outside the request path: admin, dashboard, probes, count_tokens; gateway.edge.accounted)."""
        ctx.finished_at = now = time.perf_counter()
        self.count_tokens(ctx)
        day = utc_day(ctx.ts)
        cost, avoided, baseline = _prices(ctx, day)
        ctx.result.cost_usd = cost
        e2e_s = now - ctx.started
        ttft_s = ctx.upstream.first_token_at - ctx.started if ctx.upstream.first_token_at is not None else None
        tpot_s = None
        completion = ctx.upstream.completion_tokens or 0
        if ctx.stream and ctx.upstream.first_token_at is not None and completion > 1:
            tpot_s = (now - ctx.upstream.first_token_at) / (completion - 1)
        tier = ctx.route.tier.name if ctx.route.tier else None
        fields = {
            "request_id": ctx.request_id,
            "ts": iso_ms(ctx.ts),
            "path": ctx.path,
            "tenant": ctx.tenant_name,
            "model_requested": bounded(ctx.model_requested),
            "difficulty": None if ctx.route.difficulty is None else round(ctx.route.difficulty, 4),
            "quality": _qualities(ctx),
            "route_reason": ctx.route.route_reason,
            "tier": tier,
            "backend": ctx.upstream.replica.name if ctx.upstream.replica else None,
            "status": ctx.result.status,
            "outcome": ctx.result.outcome,
            "error": None if ctx.result.error is None else bounded(ctx.result.error),
            "stream": ctx.stream,
            "prompt_tokens": ctx.upstream.prompt_tokens or 0,
            "completion_tokens": completion,
            "cached_tokens": ctx.upstream.cached_tokens,
            "usage_source": ctx.upstream.usage_source,
            "priced_from": ctx.result.priced_from,
            "ttft_ms": _ms(ttft_s),
            "tpot_ms": _ms(tpot_s),
            "e2e_ms": _ms(e2e_s),
            "queue_ms": round(ctx.queue_ms * 1000) / 1000,
            "predicted_ttft_ms": _ms(ctx.route.predicted_ttft_s),
            "brownout_from": ctx.route.brownout_from,
            "rerouted_from": ctx.route.rerouted_from,
            "spilled_from": ctx.route.spill.spilled_from if ctx.route.spill else None,  # issue 39: and both tiers' predictions
            "spill": ctx.route.spill.report() if ctx.route.spill and ctx.route.spill.target else None,
            # a low-confidence answer asked again of the next tier up: both parts (issue 39)
            **escalation_fields(ctx, day, cost),
            "max_tokens": ctx.max_tokens,
            "max_tokens_clamped_from": ctx.max_tokens_asked,
            "attempts": ctx.upstream.attempts,
            "prefix_blocks": ctx.route.prefix_blocks,
            "output_capped": ctx.upstream.output_capped,
            "finish_reason": bounded(ctx.upstream.finish_reason),
            "cache": ctx.cache,
            "cost_usd": cost,
            "avoided_cost_usd": avoided,
            "baseline_cost_usd": baseline,
            "saved_usd": nano_usd(baseline - cost),
            "ttft_slo_ms": ctx.tenant.ttft_slo_ms if ctx.tenant else None,
            "resumed": bool(ctx.upstream.resumed_parts),  # a stream that broke and went on elsewhere (issue 32)
            "parts": priced_parts(ctx, day) if ctx.upstream.resumed_parts else None,
            "session": ctx.route.session,  # the sticky-tier session, and what it did to this turn's tier
            "session_route": ctx.route.session_route,
        }
        fields.update(ctx.assignment.log_fields() if ctx.assignment is not None else NO_ARM)
        if ctx.config.policy.log_replay_fields:
            fields.update(replay_fields(ctx))  # what routing used, as numbers: `gateway whatif` replays it (issue 40)
        log_request(fields)
        if not observe:
            return
        self._metrics.observe(tier or "none", ctx.result.status, e2e_s, ttft_s, tpot_s, cost)
        good = meets_slo(ctx, ttft_s)
        self._metrics.live.record(ctx, ttft_s, tpot_s, baseline - cost, good)
        self._metrics.outcomes.observe(ctx, good, baseline - cost)

    def input_tokens(self, tier: Tier, body: dict[str, Any]) -> int:
        """A chat body's prompt tokens as `tier`'s backend counts them (POST /v1/messages/count_tokens)."""
        return self._counters.for_spec(tier.tokenizer).count_prompt("chat", body)

    def count_tokens(self, ctx: RequestContext) -> None:
        """Fill in counts the backend did not report: output chunks (streams) or a tokenizer; an abandoned
        attempt's estimated output stays. Once: the relay counts when it sends the client a usage chunk of its
        own, and the log line then says the same. Says what the price is made of (`priced_from`)."""
        if ctx.upstream.usage_source == "backend":
            ctx.result.priced_from = "backend_usage"
        if ctx.upstream.usage_source is not None or not (ctx.upstream.upstream_started or ctx.result.priced_from) or ctx.route.tier is None:
            return
        counter = self._counters.for_spec(ctx.route.tier.tokenizer)
        completion = None
        if ctx.result.priced_from is None:
            completion = ctx.upstream.output_chunks if ctx.stream else counter.count(ctx.upstream.response_text or "")
            ctx.result.priced_from = "counted"
        ctx.upstream.counted(counter.count_prompt(ctx.endpoint, ctx.body), completion)


def _prices(ctx: RequestContext, day: date) -> tuple[float, float, float]:
    """(cost, avoided by the cache, the same tokens on the baseline tier), at the prices of the day served.

    Served requests cost their tokens (aborted streams: the tokens generated; a client gone before the
    answer: the prompt and the estimated output); cache hits cost 0 and avoided their tier's price; requests
    no backend worked on cost 0 against a baseline of 0."""
    hit = ctx.cache in ("hit", "semantic_hit")
    if ctx.route.tier is None or not (ctx.upstream.upstream_started or ctx.result.priced_from or hit):
        return 0.0, 0.0, 0.0
    tokens = (ctx.upstream.prompt_tokens or 0, ctx.upstream.completion_tokens or 0, ctx.upstream.cached_tokens)
    priced = (sum(part["cost_usd"] for part in priced_parts(ctx, day)) if ctx.upstream.resumed_parts
              else ctx.route.tier.price_at(day).cost_usd(*tokens))  # a resumed answer: each part on its own tier
    base = ctx.config.baseline
    baseline = priced if base is ctx.route.tier else base.price_at(day).cost_usd(*tokens)
    if ctx.escalation is not None:  # escalated: the first tier's answer was work done too (issue 39)
        priced, baseline = priced + first_cost(ctx, day), baseline + first_cost(ctx, day, base)
    return (0.0, priced, baseline) if hit else (priced, 0.0, baseline)


def _qualities(ctx: RequestContext) -> dict[str, float] | None:
    """Each tier's predicted quality when quality_floor chose the tier (tier -> score)."""
    choice = ctx.route.quality_choice
    return None if choice is None else {o.tier: round(o.quality, 4) for o in choice.options}


def _ms(seconds: float | None) -> float | None:
    """Milliseconds to the microsecond. round(x) / 1000, not round(x, 3): Python rounds to digits through a
    decimal string (~3x the instructions), and a measured time has no tie worth it (the log line has several)."""
    return None if seconds is None else round(seconds * 1_000_000) / 1000
