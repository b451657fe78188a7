"""Session: after route, a conversation keeps the tier its turns were served at, moving only up (issues 32, 38).

For model 'auto' under a tenant policy with `sessions` (a TTL), a turn is served by the tier its session holds
when that is above the routed one (`ctx.route.session_route` "held", and the route reason says so), else by its own
(new, kept, upgraded). The session is the one its x-session-id names, else the conversation so far
(gateway.routing.sessions: a first turn inherits nothing; a later turn is found by the conversation through the
last assistant reply, which the previous turn recorded with its answer). A tier the tenant may no longer use,
or too small for the request's `max_tokens`, is not held (the turn's own tier serves).

`held_tier` is the decision as a pure function; `SessionStage` looks the session up, decides, and records the
turn (with an x-session-id at once, atomically; else after the answer, under the conversation through it).
`dry` looks up only. Said in the `x-gateway-session` and `x-gateway-route-reason` response headers, the log line
(`session`, `session_route`) and `route explain`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.context import RequestContext
from gateway.routing.sessions import ConversationKeys, Held, SessionStore, conversation_keys, header_key
from gateway.types import AUTO_MODEL, Reply

Spawn = Callable[[Coroutine[Any, Any, Any]], None]


class SessionDecision(NamedTuple):
    tier: Tier  # the tier that serves the turn
    route: str  # new, kept, upgraded or held
    holds: Held  # what the session holds after this turn


def held_tier(config: GatewayConfig, tenant: TenantPolicy | None, routed: Tier, before: Held | None,
              max_tokens: int | None, ranks: Mapping[str, int] | None = None) -> SessionDecision:
    """The tier serving a turn routed to `routed` in a session that held `before` (None: a new one)."""
    ranks = ranks if ranks is not None else tier_ranks(config)
    mine = Held(ranks[routed.name], routed.name)
    holds = mine if before is None or mine.rank >= before.rank else before
    target = config.tiers.get(holds.tier)
    if holds.tier == routed.name or target is None or not may_serve(tenant, target, max_tokens):
        route = "new" if before is None else "upgraded" if mine.rank > before.rank else "kept"
        return SessionDecision(routed, route, holds)
    return SessionDecision(target, "held", holds)


def tier_ranks(config: GatewayConfig) -> dict[str, int]:
    """Each tier's place in routes (cheapest first)."""
    return {t.name: i for i, t in enumerate(config.routes.tiers)}


def may_serve(tenant: TenantPolicy | None, tier: Tier, max_tokens: int | None) -> bool:
    """Whether the session's tier may serve this turn: the tenant may use it, it serves chat, and it fits."""
    if tenant is not None and not tenant.allows(tier.name):
        return False
    if tier.endpoint != "chat":
        return False
    return max_tokens is None or max_tokens <= tier.context_window


class SessionStage:
    def __init__(self, store: SessionStore | None, spawn: Spawn | None = None) -> None:
        self._store = store
        self._spawn = spawn or _spawn  # background writes (the app's BackgroundWrites.spawn)
        self._ranks: tuple[GatewayConfig | None, dict[str, int]] = (None, {})

    def idle(self, config: GatewayConfig) -> bool:
        """No store, or no policy under `config` keeps sessions: the step does nothing."""
        return self._store is None or not any(p.sessions is not None for p in config.policies())

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        await self._decide(ctx, dry=False)
        return None

    async def dry(self, ctx: RequestContext) -> None:
        """The same decision, nothing recorded (`route explain`)."""
        await self._decide(ctx, dry=True)

    def applies(self, ctx: RequestContext) -> bool:
        tenant, tier = ctx.tenant, ctx.route.tier
        return tenant is not None and tenant.sessions is not None and tier is not None \
            and ctx.model_requested == AUTO_MODEL and tier.endpoint == "chat" and ctx.reading is not None

    @property
    def store(self) -> SessionStore | None:
        return self._store

    async def _decide(self, ctx: RequestContext, dry: bool) -> None:
        store = self._store
        if store is None or not self.applies(ctx):
            return
        tenant, routed = ctx.tenant, ctx.route.tier
        assert tenant is not None and tenant.sessions is not None and routed is not None and ctx.reading is not None
        ttl_s = tenant.sessions.ttl_s
        ranks = self._ranks_of(ctx.config)
        keys: ConversationKeys | None = None
        if ctx.session_header:
            key = header_key(tenant.name, ctx.session_header)
            if dry:
                before = await store.peek(key)
            else:  # recorded now, atomically: turns of one named session may arrive at once
                _, before = await store.hold(key, Held(ranks[routed.name], routed.name), ttl_s)
        else:
            keys = conversation_keys(tenant.name, ctx.reading)
            key = keys.lookup or keys.current()
            before = await store.peek(keys.lookup) if keys.lookup is not None else None
        decision = held_tier(ctx.config, tenant, routed, before, ctx.max_tokens, ranks)
        ctx.route.session, ctx.route.session_route = key, decision.route
        if decision.route == "held":
            ctx.route.session_from, ctx.route.tier = routed.name, decision.tier
            why = f" ({ctx.route.route_reason})" if ctx.route.route_reason else ""
            ctx.route.route_reason = f"held: the conversation's session holds {decision.tier.name}; routed {routed.name}{why}"
        if keys is not None and not dry:
            ctx.keep_text = True  # the answer's text names the conversation the next turn continues
            ctx.finishers.append(_Record(store, keys, decision.holds, ttl_s, self._spawn))

    def _ranks_of(self, config: GatewayConfig) -> dict[str, int]:
        """Each tier's place in routes (cheapest first), computed once per config version."""
        known, ranks = self._ranks
        if known is not config:
            ranks = tier_ranks(config)
            self._ranks = (config, ranks)
        return ranks


class _Record:
    """After the answer: the conversation through it holds the session's tier (the next turn looks it up)."""

    __slots__ = ("store", "keys", "holds", "ttl_s", "spawn")

    def __init__(self, store: SessionStore, keys: ConversationKeys, holds: Held, ttl_s: int, spawn: Spawn) -> None:
        self.store, self.keys, self.holds, self.ttl_s, self.spawn = store, keys, holds, ttl_s, spawn

    def __call__(self, ctx: RequestContext) -> None:
        if ctx.result.status != 200 or ctx.result.outcome != "ok" or ctx.upstream.response_text is None:
            return
        key = self.keys.answered(ctx.upstream.response_text)
        self.store.hold_here(key, self.holds, self.ttl_s)
        self.spawn(self.store.hold(key, self.holds, self.ttl_s))


_PENDING: set[asyncio.Task[Any]] = set()


def _spawn(write: Coroutine[Any, Any, Any]) -> None:
    task = asyncio.get_running_loop().create_task(write)
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)
