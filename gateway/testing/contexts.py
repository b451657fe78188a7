"""Request contexts for calling a stage directly, with no server: as the edge makes them, or already parsed."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.routing.detour import DetourStage
from gateway.routing.ranking import RankStage
from gateway.routing.session import SessionStage
from gateway.routing.spill import SpillStage
from gateway.routing.tiers import RouteStage
from gateway.stages.parse import ParseStage
from gateway.testing.builders import TEST_API_KEY
from gateway.types import Endpoint


def request_context(config: GatewayConfig, body: Mapping[str, Any], *, api_key: str | None = TEST_API_KEY,
                    endpoint: Endpoint = "chat", request_id: str = "test") -> RequestContext:
    """The context the edge makes for a POST of `body` with `api_key` (None: no key): nothing parsed yet."""
    return RequestContext(request_id, endpoint, config, orjson.dumps(body), api_key, time.perf_counter(), time.time())


async def parsed_context(config: GatewayConfig, body: Mapping[str, Any], *, api_key: str | None = TEST_API_KEY,
                         endpoint: Endpoint = "chat", request_id: str = "test") -> RequestContext:
    """`request_context` after the parse stage: what the stages after it start from."""
    ctx = request_context(config, body, api_key=api_key, endpoint=endpoint, request_id=request_id)
    await ParseStage()(ctx)
    return ctx


async def routed(ctx: RequestContext, pool: ReplicaPool | None = None, *,
                 sessions: SessionStage | None = None) -> RequestContext:
    """`ctx` (past the policy stage) through the route's steps as the request path orders them: the candidate
    tier, the session (when given), the detour, the spill, the ranking (no prefix store: no affinity)."""
    pool = pool or ReplicaPool()
    steps = (RouteStage(), *((sessions,) if sessions is not None else ()), DetourStage(pool), SpillStage(pool),
             RankStage(pool))
    for step in steps:
        await step(ctx)
    return ctx


def run_finishers(ctx: RequestContext) -> None:
    """The finishers the stages left on `ctx`, in order (`RequestPath.finish` without the accounting before
    them: set what a finisher reads from it, such as `cost_usd` or the token counts, first)."""
    for finisher in ctx.finishers:
        finisher(ctx)
