"""Resume: a stream that broke after its first byte continues on another replica (issue 32).

The proxy stage hands each streamed attempt's relay a `StreamResumer` (`StreamResumes.for_request`) unless
the tenant's policy turned resuming off. When the upstream breaks (reset, EOF before [DONE], idle past the
read timeout), the relay asks it for a continuation: the resumer posts `continuation_body` (the original
request, the text the client has as the start of the assistant's turn, `max_tokens` less the tokens sent)
(as a /completions prompt rendered by the replica's own template where it has llama.cpp's POST /apply-template)
to the tier's other replicas in rank order, then to the replicas of the later tiers the tenant may use,
skipping the replica that just broke, within the tenant's `resume.max_attempts` and the retry budget. The
first that answers streams on through a `ContinuationScanner`: the client sees one stream.

Never for `n > 1`, requests offering tools, completions with a non-string prompt, or tiers serving a protocol
natively: the stream then ends with its error event, saying why it was not resumed. The context keeps each
part (`ctx.upstream.resumed_parts`: replica, tier, tokens sent before it); accounting prices each part on its own tier
(`part_tokens`). Metric: `gateway_stream_resumes_total{outcome}`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

import orjson
import structlog

from gateway.backends.h1 import UpstreamClient
from gateway.backends.pool import Lease, ReplicaPool
from gateway.backends.relay import Continuation, StreamEnd
from gateway.backends.upstream import Retry, post, read_answer
from gateway.backends.urls import without_suffix
from gateway.config import Replica, Tier
from gateway.config.routes import Upstream
from gateway.context import RequestContext
from gateway.errors import UpstreamStatus
from gateway.keyspace import cache_salt
from gateway.metrics import GatewayMetrics
from gateway.metrics.promfast import Counter
from gateway.sse import SseScanner, StreamTally
from gateway.tokens import TokenCounters
from gateway.upstream.attempt import PATHS, Attempt, may_try
from gateway.upstream.continuation import ContinuationScanner, continuation_body, not_resumable
from gateway.upstream.sink import ContextSink, outputs

log = structlog.get_logger("gateway.proxy")

OUTCOMES = ("resumed", "refused", "no_replica", "failed", "limit", "budget", "whole")


@dataclass(frozen=True, slots=True)
class ResumePart:
    """One part of a resumed answer: where it streamed from, and how many tokens the client had before it."""

    replica: str
    tier: Tier
    sent_before: int


class StreamResumes:
    """The app's resuming: the upstream client, the pool, the metrics, the tiers' token counters. Builds one
    resumer per streamed request."""

    def __init__(self, client: UpstreamClient, pool: ReplicaPool, metrics: GatewayMetrics,
                 count_tokens: Callable[[RequestContext], None], counters: TokenCounters) -> None:
        self.client = client
        self.pool = pool
        self.metrics = metrics
        self.count_tokens = count_tokens
        self.counters = counters
        self._chat_servers: set[str] = set()  # replicas without POST /apply-template: they continue a chat
        counter = Counter("gateway_stream_resumes", "Streams that broke after their first byte, by what the gateway "
                          "did: resumed elsewhere, or why not", ("outcome",), registry=metrics.registry)
        self.outcomes = {outcome: counter.labels(outcome) for outcome in OUTCOMES}

    async def template(self, replica: Replica, body: dict[str, Any], settings: Upstream) -> str | None:
        """The chat's prompt as `replica`'s own chat template renders it, from llama.cpp's POST /apply-template
        (beside /v1), to continue on /completions; None for a server without that endpoint (vLLM, the emulator:
        they continue a chat themselves), remembered per replica. Raises `Retry` as `upstream.post` does."""
        if replica.name in self._chat_servers:
            return None
        root = replica.model_copy(update={"url": without_suffix(replica.url, "/v1")})
        try:
            response = await post(self.client, root, "/apply-template", orjson.dumps({"messages": body["messages"]}),
                                  settings)
            prompt = orjson.loads(await read_answer(response, replica)).get("prompt")
        except (UpstreamStatus, orjson.JSONDecodeError, AttributeError):
            prompt = None
        if not isinstance(prompt, str):
            self._chat_servers.add(replica.name)
            return None
        return prompt

    def for_request(self, ctx: RequestContext, held: Lease) -> StreamResumer | None:
        """The resumer of `ctx`'s stream (its first part holds `held`), None when its tenant turned resuming off."""
        rule = ctx.tenant.resume if ctx.tenant is not None else None
        if rule is not None and not rule.enabled:
            return None
        return StreamResumer(self, ctx, held, rule.max_attempts if rule is not None else 2)


class StreamResumer:
    """Continues one request's broken stream (the relay's `Resumer`)."""

    __slots__ = ("_app", "_ctx", "_held", "_left", "_tried")

    def __init__(self, app: StreamResumes, ctx: RequestContext, held: Lease, attempts: int) -> None:
        self._app = app
        self._ctx = ctx
        self._held = held  # the part streaming now
        self._left = attempts
        self._tried: set[str] = set()

    async def resume(self, scanner: SseScanner, code: str) -> Continuation | str | None:
        """The continuation of the stream `scanner` read, which broke with `code`; why not (str); or None when
        the answer was whole already (its finish reason sent, or all of `max_tokens`: only the end lost)."""
        ctx, app = self._ctx, self._app
        tally = scanner.tally
        if tally.finish_reason is not None and outputs(ctx)[0] == 1:  # one finish per choice: none follows it
            self._held.release(failed=True, completion=tally.content_chunks)  # it broke off before [DONE]
            app.outcomes["whole"].inc()
            return None
        why = self._refusal(tally)
        text = "".join(tally.text or ())
        sent = self._tokens(text, tally) if why is None else tally.content_chunks
        self._held.release(failed=True, completion=sent)  # the replica broke its stream
        if why is not None:
            return self._count("refused", why)
        left = None if ctx.max_tokens is None else ctx.max_tokens - sent
        if left is not None and left <= 0:
            app.outcomes["whole"].inc()
            return None
        assert ctx.route.tier is not None
        self._tried.add(self._held.replica.name)
        for replica, tier in self._candidates(ctx.route.tier, ctx.prompt_tokens_est + sent):
            if self._left <= 0:
                return self._count("limit", "its attempts are used up")
            if not may_try(ctx, app.pool, app.metrics, replica):
                return self._count("budget", "the retry budget is exhausted")
            self._left -= 1
            self._tried.add(replica.name)
            attempt = Attempt(ctx, app.pool, replica, tier=tier, tokens=ctx.prompt_tokens_est + sent, first=False)
            try:
                with attempt:  # the same attempt as the first part's: it owns the lease until the relay takes it
                    template = await app.template(replica, ctx.body, ctx.config.routes.upstream) if ctx.endpoint == "chat" else None
                    body = {**continuation_body(ctx.endpoint, ctx.body, text, sent, left, template),
                            "model": replica.model}
                    if replica.prefix_cache_salt:  # the backend's prefix cache per tenant scope (gateway.keyspace)
                        body["cache_salt"] = cache_salt(ctx.tenant)
                    await attempt.post(app.client, PATHS["completions" if template else ctx.endpoint],
                                       orjson.dumps(body))
                    first = await attempt.first_bytes()
            except Retry as err:
                log.warning("resume_attempt_failed", request_id=ctx.request_id, backend=replica.name,
                            reason=err.error.message)
                continue
            return self._switch(scanner, attempt, tier, first, code, sent, template is not None)
        return self._count("no_replica", "no other replica could take it")

    def _tokens(self, text: str, tally: StreamTally) -> int:
        """The tokens the client has: the tier's tokenizer's count of the text sent, and at least one per content
        chunk (a chunk may carry several tokens: vLLM's stream intervals, speculative decoding)."""
        tier = self._ctx.route.tier
        counted = self._app.counters.for_spec(tier.tokenizer).count(text) if tier is not None else 0
        return max(tally.content_chunks, counted)

    def _refusal(self, tally: StreamTally) -> str | None:
        if tally.text is None:
            return "the text sent was not kept"
        return not_resumable(self._ctx.endpoint, self._ctx.body)

    def _candidates(self, tier: Tier, tokens: int) -> list[tuple[Replica, Tier]]:
        """The tier's other replicas in rank order, then those of the later tiers the tenant may use."""
        ctx = self._ctx
        tiers = ctx.config.routes.tiers
        later = [t for t in tiers[tiers.index(tier) + 1:] if t.endpoint == tier.endpoint
                 and (ctx.tenant is None or ctx.tenant.allows(t.name))] if tier in tiers else []
        balancing = ctx.config.routes.balancing
        return [(replica, t) for t in (tier, *later) for replica in self._app.pool.rank(t, tokens, balancing)
                if replica.name not in self._tried]

    def _switch(self, scanner: SseScanner, attempt: Attempt, tier: Tier, first: bytes, code: str, sent: int,
                completions: bool) -> Continuation:
        """Hand the relay the next part, and record it in the context."""
        ctx = self._ctx
        replica = attempt.replica
        assert ctx.upstream.replica is not None and ctx.route.tier is not None
        if not ctx.upstream.resumed_parts:
            ctx.upstream.resumed_parts.append(ResumePart(ctx.upstream.replica.name, ctx.route.tier, 0))
        ctx.upstream.resumed_parts.append(ResumePart(replica.name, tier, sent))
        ctx.upstream.replica = replica
        ctx.cache_key = None  # a resumed answer is never stored: it is two generations
        log.info("stream_resumed", request_id=ctx.request_id, backend=replica.name, tier=tier.name, reason=code,
                 sent=sent, part=len(ctx.upstream.resumed_parts))
        self._app.outcomes["resumed"].inc()
        response, self._held = attempt.hand_over()
        before = tuple(part.sent_before for part in ctx.upstream.resumed_parts)
        continued = ContinuationScanner(scanner, before, completions=completions)
        return Continuation(response, first, continued, ResumedSink(ctx, self._held, self._app.count_tokens, before))

    def _count(self, outcome: str, why: str) -> str:
        self._app.outcomes[outcome].inc()
        log.warning("stream_not_resumed", request_id=self._ctx.request_id, why=why)
        return why


class ResumedSink(ContextSink):
    """The context sink of a continuation. The client's usage describes its request: the prompt once, every token
    sent (`ContinuationScanner`, or the gateway's counts for a backend that sends none). The context keeps the
    work done, which accounting prices: part i read the original prompt P plus the k_i tokens sent before it,
    so the prompt total is n*P + sum(k_i) (`part_tokens` splits it back)."""

    __slots__ = ("_sent",)

    def __init__(self, ctx: RequestContext, lease: Lease, count_tokens: Callable[[RequestContext], None],
                 sent: tuple[int, ...]) -> None:
        super().__init__(ctx, lease, count_tokens)
        self._sent = sent

    def counted_usage(self, tally: StreamTally) -> dict[str, int]:
        usage = super().counted_usage(tally)  # the client's: the prompt counted once
        self._as_work()
        return usage

    def closed(self, tally: StreamTally, end: StreamEnd) -> None:
        super().closed(tally, end)
        if self._ctx.upstream.usage_source is None and self._ctx.upstream.upstream_started:
            self._count_tokens(self._ctx)
            self._as_work()

    def _settle(self, tally: StreamTally) -> None:
        super()._settle(tally)
        if tally.usage is not None:  # the backend's usage, as the client has it (`ContinuationScanner._merged`)
            self._as_work()

    def _as_work(self) -> None:
        """The request's prompt (P, the client's) made every part's: n*P + sum(k_i)."""
        ctx = self._ctx
        if ctx.upstream.prompt_tokens is not None:
            ctx.upstream.prompt_tokens = ctx.upstream.prompt_tokens * len(self._sent) + sum(self._sent)


def part_tokens(ctx: RequestContext) -> list[tuple[ResumePart, int, int]]:
    """Each part of a resumed answer with its (prompt, completion) tokens, from the request's totals: part i read
    the original prompt P plus the k_i tokens sent before it, so the prompt total is n*P + sum(k_i)."""
    parts = ctx.upstream.resumed_parts
    sent = [part.sent_before for part in parts]
    prompt = ((ctx.upstream.prompt_tokens or 0) - sum(sent)) // len(parts)
    ends = [*sent[1:], max(ctx.upstream.completion_tokens or 0, sent[-1])]
    return [(part, prompt + part.sent_before, end - part.sent_before) for part, end in zip(parts, ends, strict=True)]


def priced_parts(ctx: RequestContext, day: date) -> list[dict[str, Any]]:
    """The log line's `parts` of a resumed answer: each part's replica, tier, tokens and cost on its own tier
    (the backend's cached prompt tokens, reported at the end, count on the last part)."""
    parts = part_tokens(ctx)
    out = []
    for i, (part, prompt, completion) in enumerate(parts):
        cached = min(ctx.upstream.cached_tokens, prompt) if i == len(parts) - 1 else 0
        out.append({"replica": part.replica, "tier": part.tier.name, "prompt_tokens": prompt,
                    "completion_tokens": completion, "cost_usd": part.tier.price_at(day).cost_usd(prompt, completion,
                                                                                                   cached)})
    return out
