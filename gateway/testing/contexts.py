"""Request contexts for calling a stage directly, with no server: as the edge makes them, or already parsed."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import GatewayConfig
from gateway.context import RequestContext
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


def run_finishers(ctx: RequestContext) -> None:
    """The finishers the stages left on `ctx`, in order (`RequestPath.finish` without the accounting before
    them: set what a finisher reads from it, such as `cost_usd` or the token counts, first)."""
    for finisher in ctx.finishers:
        finisher(ctx)
