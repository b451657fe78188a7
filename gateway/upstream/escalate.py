"""Escalate, the step after the answer (issue 39): an answer whose confidence is below the tenant's
`escalate.min_confidence` is asked again of the next tier up, and that answer is returned.

    proxy (the hop asked the tier for log-probabilities: gateway.routing.escalate.armed)
      -> escalate: the answer's confidence (a stream with `hold_tokens: K`: its first K tokens', read from its relay
                   and held, none sent yet); confident, or none measured: the answer (the held chunks, then the rest
                   of the stream), its log-probabilities stripped unless the client asked; else the next tier's
                   replicas ranked, a slot of its admission gate (none free in `max_wait_ms`: the first answer), the
                   hop again (`UpstreamHop.answer`: its own attempts, each owning its lease), and that answer; a
                   second tier that fails or sheds leaves the first answer, said in the log (`escalation.outcome`)

A held stream stays open (its relay owning its lease) until the second tier's first byte came; then its relay is
closed, which ends its lease and says what it generated. The first part is kept in `ctx.escalation` (tier, replica,
tokens): accounting prices both parts, the log line names them (`escalated_from`, `escalation.parts`), the response
says `x-gateway-escalated-from`. An escalated answer is never stored in the cache (its key is the first tier's). The
second hop takes no retry from the budget: it is the policy's request, not a retry. Metric:
`gateway_escalations_total{outcome}`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import structlog

from gateway.config import GatewayConfig, Tier
from gateway.config.policies import Escalate
from gateway.context import RequestContext
from gateway.errors import GatewayError, Overloaded
from gateway.metrics import GatewayMetrics
from gateway.metrics.promfast import Counter
from gateway.routing.decision import Escalation
from gateway.routing.escalate import (
    armed, client_asked, confidence, escalates, next_tier, strip_logprobs, token_logprobs,
)
from gateway.routing.ranking import RankStage
from gateway.stages.admission import AdmissionStage
from gateway.types import JsonReply, Reply, StreamReply
from gateway.upstream.held import HeldStream
from gateway.upstream.hop import UpstreamHop

log = structlog.get_logger("gateway.escalate")

OUTCOMES = ("kept", "escalated", "no_confidence", "no_replica", "shed", "failed")
HITS = ("hit", "semantic_hit")
# what the second hop changes in the context, put back when it does not answer (the first answer is returned)
# (the route's record, `ctx.route`, is saved whole: a copy, put back whole; of `ctx.upstream`, these fields; of
# `ctx.result`, its pricing and error, through its `put_back`)
_STATE = ("first_byte_hooks", "cache_key")
_UPSTREAM_STATE = ("replica", "attempts", "prompt_tokens", "completion_tokens", "cached_tokens", "usage_source",
                   "finish_reason", "response_text", "first_token_at", "output_capped")


class EscalateStage:
    """The request path's step after the answer (`RequestPath.escalate`): takes the reply, returns the one to send."""

    def __init__(self, hop: UpstreamHop, rank: RankStage, admission: AdmissionStage, metrics: GatewayMetrics) -> None:
        self._hop = hop
        self._rank = rank
        self._admission = admission
        counter = Counter("gateway_escalations", "Answers checked for confidence (tenants with escalate), by what "
                          "the gateway did", ("outcome",), registry=metrics.registry)
        self.outcomes = {outcome: counter.labels(outcome) for outcome in OUTCOMES}

    def idle(self, config: GatewayConfig) -> bool:
        """No policy under `config` escalates: every reply passes through unchanged."""
        return not any(p.escalate is not None for p in config.policies())

    async def __call__(self, ctx: RequestContext, reply: Reply) -> Reply:
        rule = armed(ctx)
        if rule is None or not ctx.upstream.upstream_started or ctx.cache in HITS:
            return reply
        if isinstance(reply, StreamReply):
            return await self._held(ctx, reply, rule) if ctx.upstream.held_logprobs is not None else reply
        if reply.status != 200:
            return reply
        try:
            answer = orjson.loads(reply.body)
            choice = answer["choices"][0]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            return reply
        value = confidence(token_logprobs(choice), rule.measure) if isinstance(choice, dict) else None
        first = self._first(ctx, rule, value, ctx.upstream.prompt_tokens or 0, ctx.upstream.completion_tokens or 0, ctx.upstream.cached_tokens)
        if not escalates(value, rule):
            self._kept(ctx, first)
            return self._client_answer(ctx, reply, answer)
        second = await self._second(ctx, first)
        if isinstance(second, str):
            return self._client_answer(ctx, reply, answer)
        self._escalated(ctx, first)
        return second

    async def _held(self, ctx: RequestContext, reply: StreamReply, rule: Escalate) -> Reply:
        """A stream held for its first `hold_tokens` tokens (none sent yet): kept, or the next tier's stream."""
        logprobs = ctx.upstream.held_logprobs
        assert logprobs is not None and rule.hold_tokens is not None and ctx.route.tier is not None
        source = reply.source
        rest: AsyncIterator[bytes] | None = source.chunks()
        held: list[bytes] = []
        try:
            while len(logprobs) < rule.hold_tokens and rest is not None:
                try:
                    held.append(await anext(rest))
                except StopAsyncIteration:
                    rest = None  # the whole answer came within the hold
        except BaseException:
            source.close()  # the client left, or the relay failed: its lease ends with it
            raise
        kept = StreamReply(HeldStream(held, rest, source), reply.headers)
        value = confidence(logprobs[:rule.hold_tokens], rule.measure)
        prompt = self._hop.resumes.counters.for_spec(ctx.route.tier.tokenizer).count_prompt(ctx.endpoint, ctx.body)
        first = self._first(ctx, rule, value, prompt, len(logprobs), 0)
        if not escalates(value, rule):
            self._kept(ctx, first)
            return kept
        second = await self._second(ctx, first)
        if isinstance(second, str):
            return kept
        if (end := getattr(rest, "aclose", None)) is not None:
            await end()  # the relay's generator (SseRelay.chunks), left where it was
        self._end_first(ctx, source)
        self._escalated(ctx, ctx.escalation or first)
        return second

    @staticmethod
    def _end_first(ctx: RequestContext, source: Any) -> None:
        """Close the held stream's relay (it releases its lease and tallies what it generated into the context),
        take its tokens for the first part, and give the context back to the second."""
        capped, error, cached = ctx.upstream.output_capped, ctx.result.error, ctx.upstream.cached_tokens
        source.close()
        first = ctx.escalation
        assert first is not None
        if ctx.upstream.usage_source == "backend":  # it ended within the hold: its own counts
            prompt, completion = ctx.upstream.prompt_tokens or first.prompt_tokens, ctx.upstream.completion_tokens or 0
        else:
            prompt, completion = first.prompt_tokens, max(first.completion_tokens, ctx.upstream.output_chunks)
        ctx.escalation = dataclasses.replace(first, prompt_tokens=prompt, completion_tokens=completion)
        ctx.upstream.prompt_tokens = ctx.upstream.completion_tokens = ctx.upstream.usage_source = None
        ctx.result.priced(None)
        upstream = ctx.upstream
        upstream.output_chunks, upstream.first_token_at, upstream.finish_reason, upstream.response_text = 0, None, None, None
        ctx.upstream.output_capped, ctx.upstream.cached_tokens = capped, cached
        ctx.result.flag(error)

    async def _second(self, ctx: RequestContext, first: Escalation) -> Reply | str:
        """The next tier's answer, or why there is none (the context as the first answer left it)."""
        target = next_tier(ctx)
        assert target is not None  # armed: a tier above
        saved: dict[str, Any] = {name: getattr(ctx, name) for name in _STATE}
        saved["route"] = dataclasses.replace(ctx.route)
        saved["upstream"] = {name: getattr(ctx.upstream, name) for name in _UPSTREAM_STATE}
        saved["result"] = (ctx.result.priced_from, ctx.result.error)
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
        ctx.route.escalate_to(target)
        choice.apply(ctx)
        ctx.upstream.attempts = 0  # not a retry: the budget is for failures
        ctx.upstream.prompt_tokens = ctx.upstream.completion_tokens = ctx.upstream.usage_source = None
        ctx.result.priced(None)
        ctx.upstream.cached_tokens, ctx.cache_key = 0, None  # never stored: the key is the first tier's
        ctx.first_byte_hooks = [permit.sample] if permit is not None else []
        try:
            reply = await self._hop.answer(ctx)
        except GatewayError as err:
            log.warning("escalation_failed", request_id=ctx.request_id, to_tier=target.name, reason=err.message)
            if permit is not None:
                permit.release()
            return self._back(ctx, saved, first, "failed")
        except BaseException:
            if permit is not None:
                permit.release()
            raise
        if permit is not None:  # a stream holds its slot to its end (the finishers run after it)
            if ctx.stream:
                ctx.finishers.append(lambda _: permit.release())
            else:
                permit.release()
        ctx.upstream.attempts += saved["upstream"]["attempts"]
        return reply

    def _back(self, ctx: RequestContext, saved: dict[str, Any], first: Escalation, outcome: str) -> str:
        for name, value in saved.items():
            if name == "upstream":
                for field, kept in value.items():
                    setattr(ctx.upstream, field, kept)
            elif name == "result":
                ctx.result.put_back(*value)
            else:
                setattr(ctx, name, value)
        ctx.escalation = dataclasses.replace(first, outcome=outcome)
        self.outcomes[outcome].inc()
        return outcome

    @staticmethod
    def _first(ctx: RequestContext, rule: Escalate, value: float | None, prompt: int, completion: int,
               cached: int) -> Escalation:
        assert ctx.route.tier is not None
        return Escalation(rule, value, ctx.route.tier, ctx.upstream.replica.name if ctx.upstream.replica else None, prompt, completion, cached,
                          round((time.perf_counter() - ctx.started) * 1000, 3))

    def _kept(self, ctx: RequestContext, first: Escalation) -> None:
        ctx.escalation = dataclasses.replace(first, outcome="kept" if first.confidence is not None else "no_confidence")
        self.outcomes[ctx.escalation.outcome].inc()

    def _escalated(self, ctx: RequestContext, first: Escalation) -> None:
        self.outcomes["escalated"].inc()
        log.info("escalated", request_id=ctx.request_id, from_tier=first.from_tier.name,
                 to_tier=ctx.route.tier.name if ctx.route.tier else None, confidence=first.confidence,
                 min_confidence=first.rule.min_confidence)

    @staticmethod
    def _client_answer(ctx: RequestContext, reply: JsonReply, answer: dict[str, Any]) -> JsonReply:
        """The answer as the client asked it: without the log-probabilities the gateway asked for."""
        if client_asked(ctx.endpoint, ctx.body):
            return reply
        strip_logprobs(answer)
        return JsonReply(reply.status, orjson.dumps(answer), reply.headers)
