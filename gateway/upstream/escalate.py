"""Escalate, the step after the answer (issue 39): a non-streamed answer whose confidence is below the tenant's
`escalate.min_confidence` is asked again of the next tier up, and that answer is returned.

    proxy (the hop asked the tier for log-probabilities: gateway.routing.escalate.armed)
      -> escalate: confidence of the answer; confident (or none measured): the answer, its log-probabilities
                   stripped unless the client asked; else the next tier's replicas ranked, a slot of its
                   admission gate (none free in `max_wait_ms`: the first answer), the hop again (`UpstreamHop.answer`:
                   its own attempts, each owning its lease), and that answer; a second tier that fails or sheds
                   leaves the first answer, said in the log (`escalation.outcome`)

The first part is kept in `ctx.escalation` (tier, replica, tokens): accounting prices both parts, the log line
names them (`escalated_from`, `escalation.parts`), the response says `x-gateway-escalated-from`. An escalated
answer is never stored in the cache (its key is the first tier's). The second hop takes no retry from the budget:
it is the policy's request, not a retry. Metric: `gateway_escalations_total{outcome}`.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import structlog

from gateway.config import Tier
from gateway.context import RequestContext
from gateway.errors import GatewayError, Overloaded
from gateway.metrics import GatewayMetrics
from gateway.metrics.promfast import Counter
from gateway.routing.escalate import (
    Escalation, armed, client_asked, confidence, escalates, next_tier, strip_logprobs, token_logprobs,
)
from gateway.routing.ranking import RankStage
from gateway.stages.admission import AdmissionStage
from gateway.types import JsonReply, Reply
from gateway.upstream.hop import UpstreamHop

log = structlog.get_logger("gateway.escalate")

OUTCOMES = ("kept", "escalated", "no_confidence", "no_replica", "shed", "failed")
HITS = ("hit", "semantic_hit")
# what the second hop changes in the context, put back when it does not answer (the first answer is returned)
_STATE = ("tier", "candidates", "replica", "attempts", "prefix_replica", "prefix_blocks", "prefix_tokens", "explored",
          "prompt_tokens", "completion_tokens", "cached_tokens", "usage_source", "priced_from", "finish_reason",
          "response_text", "first_token_at", "output_capped", "error", "first_byte_hooks", "cache_key")


class EscalateStage:
    """The request path's step after the answer (`RequestPath.escalate`): takes the reply, returns the one to send."""

    def __init__(self, hop: UpstreamHop, rank: RankStage, admission: AdmissionStage, metrics: GatewayMetrics) -> None:
        self._hop = hop
        self._rank = rank
        self._admission = admission
        counter = Counter("gateway_escalations", "Answers checked for confidence (tenants with escalate), by what "
                          "the gateway did", ("outcome",), registry=metrics.registry)
        self.outcomes = {outcome: counter.labels(outcome) for outcome in OUTCOMES}

    async def __call__(self, ctx: RequestContext, reply: Reply) -> Reply:
        rule = armed(ctx)
        if rule is None or not isinstance(reply, JsonReply) or reply.status != 200 or not ctx.upstream_started \
                or ctx.cache in HITS:
            return reply
        try:
            answer = orjson.loads(reply.body)
            choice = answer["choices"][0]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return reply
        value = confidence(token_logprobs(choice)) if isinstance(choice, dict) else None
        if not escalates(value, rule):
            self.outcomes["kept" if value is not None else "no_confidence"].inc()
            return self._client_answer(ctx, reply, answer)
        target = next_tier(ctx)
        assert value is not None and target is not None and ctx.tier is not None  # armed: a tier above
        first = Escalation(rule, value, ctx.tier, ctx.replica.name if ctx.replica else None, ctx.prompt_tokens or 0,
                           ctx.completion_tokens or 0, ctx.cached_tokens, round((time.perf_counter() - ctx.started) * 1000, 3))
        second = await self._second(ctx, target, first)
        if isinstance(second, str):
            self.outcomes[second].inc()
            return self._client_answer(ctx, reply, answer)
        self.outcomes["escalated"].inc()
        log.info("escalated", request_id=ctx.request_id, from_tier=first.from_tier.name, to_tier=target.name,
                 confidence=round(value, 4), min_confidence=rule.min_confidence)
        return second

    async def _second(self, ctx: RequestContext, target: Tier, first: Escalation) -> Reply | str:
        """The next tier's answer, or why there is none (the context as the first answer left it)."""
        saved: dict[str, Any] = {name: getattr(ctx, name) for name in _STATE}
        choice = await self._rank.choose(ctx, target)
        ctx.escalation = first  # from here the request is escalated: no more log-probabilities asked
        if not choice.replicas:
            return self._back(ctx, saved, first, "no_replica")
        permit = None
        if ctx.config.routes.admission.enabled:
            priority = ctx.tenant.priority if ctx.tenant else "interactive"
            try:
                permit = await self._admission.gate(ctx, target).acquire(
                    ctx.tenant_name, priority, ctx.config.routes.admission.max_wait_ms / 1000)
            except Overloaded:
                return self._back(ctx, saved, first, "shed")
        ctx.tier = target
        choice.apply(ctx)
        ctx.attempts = 0  # not a retry: the budget is for failures
        ctx.prompt_tokens = ctx.completion_tokens = ctx.usage_source = ctx.priced_from = None
        ctx.cached_tokens, ctx.cache_key = 0, None  # never stored: the key is the first tier's
        ctx.first_byte_hooks = [permit.sample] if permit is not None else []
        try:
            reply = await self._hop.answer(ctx)
        except GatewayError as err:
            log.warning("escalation_failed", request_id=ctx.request_id, to_tier=target.name, reason=err.message)
            return self._back(ctx, saved, first, "failed")
        finally:
            if permit is not None:
                permit.release()
        ctx.attempts += saved["attempts"]
        return reply

    @staticmethod
    def _back(ctx: RequestContext, saved: dict[str, Any], first: Escalation, outcome: str) -> str:
        for name, value in saved.items():
            setattr(ctx, name, value)
        ctx.escalation = Escalation(first.rule, first.confidence, first.from_tier, first.from_replica,
                                    first.prompt_tokens, first.completion_tokens, first.cached_tokens, first.first_ms,
                                    outcome)
        return outcome

    @staticmethod
    def _client_answer(ctx: RequestContext, reply: JsonReply, answer: dict[str, Any]) -> JsonReply:
        """The answer as the client asked it: without the log-probabilities the gateway asked for."""
        if client_asked(ctx.endpoint, ctx.body):
            return reply
        strip_logprobs(answer)
        return JsonReply(reply.status, orjson.dumps(answer), reply.headers)
