"""Policy: resolve the tenant from the API key and apply its limits before anything is spent.

401 unknown key · 400 max_tokens over the cap (mode reject) · 413 input too large (every input of the
request's reading: text, tools, media, token ids) · 429 rate limit or daily budget (+ Retry-After), charged
all input and every output (prompts x n) at its ceiling. Clamps max_tokens, adds the tenant's stop
sequences, and books the tokens and dollars actually used once the answer is done.
A tenant running experiments (issue 22) is replaced by the policy of the request's arm, sticky per
`user` or conversation (`gateway.experiments.assign`), before any limit applies.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig, TenantPolicy
from gateway.context import RequestContext
from gateway.errors import AuthenticationFailed, BodyTooLarge, GatewayError, InvalidRequest
from gateway.experiments.assign import assign
from gateway.limits.limiter import Limiter
from gateway.reading import Reading
from gateway.types import Reply


class PolicyStage:
    def __init__(self, limiter: Limiter | None = None,
                 record_owner: Callable[[RequestContext], None] | None = None) -> None:
        self._limiter = limiter
        self._keys = KnownKeys()
        self._record_owner = record_owner  # a finisher: who the request belonged to (POST /v1/feedback)

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        ctx.tenant = self._keys.tenant(ctx.config, ctx.api_key)
        if ctx.tenant.plan is not None and ctx.reading is not None and (
                arm := assign(ctx.tenant, ctx.reading, ctx.body.get("user"))) is not None:
            ctx.assignment, ctx.tenant = arm, arm.policy  # the arm's fields from here on, max_tokens included
        if self._record_owner is not None:
            ctx.finishers.append(self._record_owner)
        reading = apply_limits(ctx, ctx.tenant)
        if self._limiter is not None:
            estimate = reading.charge()  # all input, and every output at its ceiling
            await self._limiter.admit(ctx.tenant, estimate)
            ctx.finishers.append(lambda done: self._book(done, estimate))
        return None

    def _book(self, ctx: RequestContext, estimate: int) -> None:
        if self._limiter is not None and ctx.tenant is not None:
            worked = ctx.upstream.upstream_started or ctx.result.priced_from  # work done is booked (a client gone too)
            used = (ctx.upstream.prompt_tokens or 0) + (ctx.upstream.completion_tokens or 0) if worked else 0
            self._limiter.book(ctx.tenant, used - estimate, ctx.result.cost_usd)


class KnownKeys:
    """Tenants by API key, for keys already found valid under the serving config: a key is hashed once.

    Why these dict lookups leak nothing about a key (the argument for hmac.compare_digest holds):
    a dict compares the bytes of two keys only when their full 64-bit hashes match, and str hashes
    are SipHash under a per-process random seed, so a wrong key's lookup time depends on no byte
    of any stored key; the stored side is SHA-256, whose digests a near-miss cannot approach.
    Only keys found valid enter the memo, so guessing cannot grow it; a new config version empties it."""

    __slots__ = ("_config", "_tenants")

    def __init__(self) -> None:
        self._config: GatewayConfig | None = None
        self._tenants: dict[str, TenantPolicy] = {}

    def tenant(self, config: GatewayConfig, api_key: str | None) -> TenantPolicy:
        """The tenant owning `api_key`, or the anonymous one where the policy allows it."""
        if not api_key:
            return resolve_tenant(config, api_key)
        if config is not self._config:
            self._config, self._tenants = config, {}
        tenant = self._tenants.get(api_key)
        if tenant is None:
            tenant = self._tenants[api_key] = resolve_tenant(config, api_key)
        return tenant


def resolve_tenant(config: GatewayConfig, api_key: str | None) -> TenantPolicy:
    """The tenant owning `api_key` (hashed and looked up), or the anonymous one where the policy allows it."""
    if not api_key:
        if config.anonymous is not None:
            return config.anonymous
        raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
    tenant = config.tenants_by_key_hash.get(hashlib.sha256(api_key.encode()).hexdigest())
    if tenant is None:
        raise AuthenticationFailed("invalid API key")
    return tenant


def apply_limits(ctx: RequestContext, tenant: TenantPolicy) -> Reading:
    """The tenant's limits on the request itself (no admission): max_tokens, prompt size over every input,
    stops. Returns the request's reading, limited (its ceiling and stops are the policy's)."""
    reading = ctx.reading
    if reading is None:
        raise GatewayError("the policy stage ran before the request was read")
    ctx.max_tokens = _max_tokens(ctx, tenant)
    _check_prompt_size(ctx.endpoint, reading, tenant)
    _set_max_tokens(ctx.body, ctx.max_tokens)
    if tenant.stop:
        ctx.body["stop"] = _merged_stop(ctx.body.get("stop"), tenant.stop)
        reading.limit(ctx.max_tokens, tuple(ctx.body["stop"]))
    else:
        reading.limit(ctx.max_tokens, reading.stop)
    return reading


def _check_prompt_size(endpoint: str, reading: Reading, tenant: TenantPolicy) -> None:
    """413 when all the input (text, tools and their calls, media, token ids: `gateway.reading`) is over the
    tenant's `max_prompt_chars` or `max_prompt_tokens`."""
    param = {"chat": "messages", "completions": "prompt"}.get(endpoint, "input")
    for size, limit, unit in ((reading.input_chars, tenant.max_prompt_chars, "characters"),
                              (reading.input_tokens, tenant.max_prompt_tokens, "tokens (estimated)")):
        if limit is not None and size > limit:
            raise BodyTooLarge(f"the request's input has {size} {unit}, counting every message, content part, "
                               f"tool and token id; tenant {tenant.name!r} allows {limit}", param=param,
                               code="prompt_too_large")


def _max_tokens(ctx: RequestContext, tenant: TenantPolicy) -> int:
    """The request's max_tokens after the tenant's default, cap (clamp or reject) and output cap; a clamped
    request keeps what it asked in `ctx.max_tokens_asked`."""
    rule = tenant.max_tokens
    asked = ctx.max_tokens
    if asked is not None and asked > rule.maximum and rule.on_exceed == "reject":
        name = "max_completion_tokens" if "max_completion_tokens" in ctx.body else "max_tokens"
        raise InvalidRequest(f"'{name}' of {asked} exceeds the maximum of {rule.maximum} for tenant {tenant.name!r}",
                             param=name, code="max_tokens_exceeded")
    limit = rule.default if asked is None else min(asked, rule.maximum)
    cap = tenant.output_cap.tokens if tenant.output_cap else None
    granted = limit if cap is None else min(limit, cap)
    if asked is not None and granted < asked:  # said in x-gateway-max-tokens-clamped and the log line
        ctx.max_tokens_asked = asked
    return granted


def _set_max_tokens(body: dict[str, Any], limit: int) -> None:
    if "max_completion_tokens" in body:
        body["max_completion_tokens"] = limit
    if "max_tokens" in body or "max_completion_tokens" not in body:
        body["max_tokens"] = limit


def _merged_stop(asked: Any, extra: tuple[str, ...]) -> list[str]:
    own = [asked] if isinstance(asked, str) else list(asked or ())
    return own + [s for s in extra if s not in own]
