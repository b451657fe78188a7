"""What a request log line carries so that `gateway whatif` can replay it: numbers and digests, no prompt text.

`replay_fields(ctx)` is merged into the line by the account stage. With the fields the line already has
(ts, tenant, model_requested, difficulty, tier, stream, prompt_tokens, completion_tokens, cached_tokens,
max_tokens, max_tokens_clamped_from, cache, ttft_ms, tpot_ms, session, session_route, experiment, arm,
status, error), a replay re-decides the request under other routes and policies:

    replay             the version of these fields (REPLAY_VERSION); a line without it is replayed for price only
    arrival_s          the Unix time the request arrived (ts to the microsecond, as a number)
    quality_predicted  the quality predictor's score per measured model ({model: score}), when it ran
    turn_keys          the turn's place in its conversation, as the session step keys it (`conversation_keys`), whatever
                       the tenant's sessions rule, so a policy that turns sessions on can be replayed: `current`, the
                       digest of the conversation through this request's last message, and `parent`, the digest
                       through the message before its last assistant reply (null: a first turn), which is the
                       `current` of the turn that reply answered; with an x-session-id both are its session key
    sticky             the experiment assignment keys (`gateway.experiments.assign.sticky_key`: 64-bit hashes) by
                       conversation and by `user`: a replay re-assigns arms under the candidate's experiments (the
                       conversation's key also names it in reports: tenant, system prompt and first user message)
    reading            the request's reading summed up: input_tokens (estimate) and input_chars (the prompt caps),
                       outputs (prompts x n), generated (prompts x max(n, best_of)), cacheable ("never",
                       "deterministic": cached in either mode, "always": only in mode always) and digest (of the
                       reading: what the exact cache keys on, 16 hex, null when never cacheable)
    decode_tps         the replica's measured decode rate for this request: output tokens after the first per
                       second of decoding (null without two output tokens); its measured TTFT is `ttft_ms`
"""

from __future__ import annotations

from typing import Any

from gateway.context import RequestContext
from gateway.experiments.assign import conversation_key, conversation_texts, user_key
from gateway.routing.sessions import MESSAGE_ROLES, conversation_digest, header_key
from gateway.routing.sessions import update_digest as _digest_part  # the session step's own digest of a message part

REPLAY_VERSION = 2  # 2: turn_keys


def replay_fields(ctx: RequestContext) -> dict[str, Any]:
    """The replay fields of a finished request's log line (see the module docstring), in one pass: the log line
    of every request computes them."""
    reading = ctx.reading
    quality = ctx.route.quality
    body = ctx.body
    sticky = turn_keys = None
    if body and ctx.endpoint != "embeddings":
        tenant = ctx.tenant_name
        user = body.get("user")
        sticky = {"conversation": conversation_key(tenant, *conversation_texts(body)),
                  "user": user_key(tenant, user) if type(user) is str and user else None}
        turn_keys = _turn_keys(tenant, ctx)
    summary = None
    if reading is not None:
        cacheable = reading.cache_class
        summary = {"input_tokens": reading.input_tokens, "input_chars": reading.input_chars,
                   "outputs": reading.outputs, "generated": reading.generated, "cacheable": cacheable,
                   "digest": None if cacheable == "never" else reading.key()[:16]}
    return {"replay": REPLAY_VERSION, "arrival_s": round(ctx.ts * 1_000_000) / 1_000_000,  # (as account._ms)
            "quality_predicted": None if quality is None else {k: round(v, 4) for k, v in quality.items()},
            "sticky": sticky, "turn_keys": turn_keys, "reading": summary, "decode_tps": _decode_tps(ctx)}


def _turn_keys(tenant: str, ctx: RequestContext) -> dict[str, str | None] | None:
    """`turn_keys` (see the module docstring): with the session step's digest (`conversation_keys`'s), so `current`
    is its `ConversationKeys.current()` and a next turn's `parent` the `current` of the turn its last reply answered."""
    if ctx.session_header:
        key = header_key(tenant, ctx.session_header)
        return {"parent": key, "current": key}
    reading = ctx.reading
    if reading is None:
        return None
    parts = reading.parts
    last_reply = -1
    for part in reversed(parts):  # turns only grow: the last assistant part is the last reply's
        if part.role == "assistant":
            last_reply = part.turn
            break
    digest = conversation_digest(tenant)
    parent = None
    for part in parts:
        if part.role in MESSAGE_ROLES:
            if parent is None and part.turn == last_reply:
                parent = digest.hexdigest()
            _digest_part(digest, part)
    return {"parent": parent, "current": digest.hexdigest()}


def _decode_tps(ctx: RequestContext) -> float | None:
    completion, first, done = ctx.upstream.completion_tokens or 0, ctx.upstream.first_token_at, ctx.finished_at
    outputs = ctx.reading.outputs if ctx.reading is not None else 1
    if not ctx.stream or first is None or done is None or completion <= outputs or done <= first:
        return None  # a non-streamed answer arrives whole: its first byte is not its first token
    return round((completion - outputs) / (done - first) * 1000) / 1000
