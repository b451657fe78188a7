"""Policy: resolve the tenant from the API key and apply its max_tokens default and cap."""

from __future__ import annotations

import hashlib

from gateway.config import GatewayConfig, Tenant
from gateway.context import RequestContext
from gateway.errors import AuthenticationFailed
from gateway.types import Reply


class PolicyStage:
    async def __call__(self, ctx: RequestContext) -> Reply | None:
        config = ctx.config
        ctx.tenant = resolve_tenant(config, ctx.api_key)
        rule = (ctx.tenant.max_tokens if ctx.tenant else None) or config.policy.max_tokens
        limit = rule.default if ctx.max_tokens is None else min(ctx.max_tokens, rule.maximum)
        ctx.max_tokens = limit
        body = ctx.body
        if "max_completion_tokens" in body:
            body["max_completion_tokens"] = limit
        if "max_tokens" in body or "max_completion_tokens" not in body:
            body["max_tokens"] = limit
        return None


def resolve_tenant(config: GatewayConfig, api_key: str | None) -> Tenant | None:
    """The tenant owning `api_key`; None means anonymous, where the policy allows it."""
    if not api_key:
        if config.policy.allow_anonymous:
            return None
        raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    tenant = config.tenants_by_key_hash.get(digest)
    if tenant is None:
        raise AuthenticationFailed("invalid API key")
    return tenant
