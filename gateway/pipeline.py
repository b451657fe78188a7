"""The ordered stages of the request path and the loop that runs them."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.context import RequestContext
from gateway.errors import GatewayError
from gateway.types import Reply, Stage


async def run_stages(stages: Sequence[Stage], ctx: RequestContext) -> Reply:
    """Run stages in order until one returns a reply (a stage stops the request by raising)."""
    trace = ctx.trace if ctx.trace is not None and ctx.trace.recording else None
    for stage in stages:
        reply = await (stage(ctx) if trace is None else trace.stage(stage, ctx))
        if reply is not None:
            return reply
    raise GatewayError("no stage produced a reply")
