"""What the backend answered, written into the request's context: a relayed stream's tally (`ContextSink`,
the client's sink: it also ends the replica's lease), the usage a backend reports, and the work of an attempt
the client left before its answer came (`price_abandoned`)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gateway.backends.pool import Lease
from gateway.backends.relay import StreamEnd
from gateway.backends.stats import ReplicaStats
from gateway.context import RequestContext
from gateway.sse import StreamTally

log = structlog.get_logger("gateway.proxy")


class ContextSink:
    """Writes what a relayed stream said into the request's context, and ends the replica's lease."""

    __slots__ = ("_ctx", "_lease", "_count_tokens")

    def __init__(self, ctx: RequestContext, lease: Lease, count_tokens: Callable[[RequestContext], None]) -> None:
        self._ctx = ctx
        self._lease = lease
        self._count_tokens = count_tokens

    def failed(self, code: str) -> None:
        self._ctx.result.failed(code)

    def counted_usage(self, tally: StreamTally) -> dict[str, int]:
        ctx = self._ctx
        self._settle(tally)
        self._count_tokens(ctx)
        prompt, completion = ctx.upstream.prompt_tokens or 0, ctx.upstream.completion_tokens or 0
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def closed(self, tally: StreamTally, end: StreamEnd) -> None:
        ctx = self._ctx
        self._settle(tally)
        ctx.upstream.output_capped = ctx.upstream.output_capped or end.capped or tally.cut > 0  # one output, or some of several
        if end.added_finish is not None:
            ctx.result.flag("upstream_missing_finish", keep=True)
            log.warning("upstream_missing_finish", request_id=ctx.request_id,
                        backend=ctx.upstream.replica.name if ctx.upstream.replica else None, finish_reason=end.added_finish,
                        completion_chunks=tally.content_chunks, max_tokens=ctx.max_tokens)
        if end.delivered and ctx.result.outcome == "client_disconnected":
            ctx.result.served()  # the client had all of it, [DONE] included, then closed
        self._lease.release(failed=end.failed and ctx.result.outcome == "upstream_error",  # per output: the TPOT
                            completion=(ctx.upstream.completion_tokens or ctx.upstream.output_chunks) // outputs(ctx)[1])

    def _settle(self, tally: StreamTally) -> None:
        ctx = self._ctx
        ctx.upstream.first_token_at = tally.first_token_at
        ctx.upstream.finish_reason = tally.finish_reason
        ctx.upstream.output_chunks = tally.content_chunks
        if tally.text is not None:
            ctx.upstream.response_text = "".join(tally.text)
        if tally.malformed:
            ctx.result.flag("upstream_malformed_events", keep=True)  # forwarded without them; never cached
        apply_usage(ctx, tally.usage)


def outputs(ctx: RequestContext) -> tuple[int, int]:
    """(answers the client gets: prompts x n, answers the backend writes: prompts x max(n, best_of)), from the
    request's reading; a stream's choice indexes run over the first. The backend decodes them side by side: a
    TPOT is per output."""
    reading = ctx.reading
    return (reading.outputs, reading.generated) if reading is not None else (1, 1)


def apply_usage(ctx: RequestContext, usage: object) -> None:
    """Take the backend's own token counts when it reported them."""
    if not isinstance(usage, dict):
        return
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.usage_source = prompt, completion, "backend"
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        ctx.upstream.cached_tokens = cached if isinstance(cached, int) else 0


def price_abandoned(ctx: RequestContext, stats: ReplicaStats, elapsed_s: float) -> None:
    """A client left an attempt before its answer came, `elapsed_s` after it was sent: the backend had read
    the prompt (accounting counts it with the tier's tokenizer) and wrote, per output, about one token at
    its first-token time and one more each TPOT since (the replica's measured decode rate), up to
    max_tokens. No measured rate: the prompt only. A stream (the relay did not take it over yet) had
    sent no byte: it wrote nothing yet (its first token is sent as soon as it is made)."""
    ctx.upstream.completion_tokens = 0
    ctx.result.priced("prompt_only")  # the backend had the request: its work is priced (accounting)
    if ctx.stream:
        return
    tpot = stats.tpot_s
    if tpot is None or tpot <= 0:
        return
    ttft = ctx.route.predicted_ttft_s if ctx.route.predicted_ttft_s is not None and ctx.upstream.attempts == 1 else stats.ttft_s
    decoding = elapsed_s - (ttft or 0.0)
    if decoding < 0:
        per_output = 0
    else:
        per_output = 1 + int(decoding / tpot)
        if ctx.max_tokens is not None:
            per_output = min(per_output, ctx.max_tokens)
    ctx.upstream.completion_tokens = per_output * outputs(ctx)[1]
    ctx.result.priced("estimated_decode_rate")
