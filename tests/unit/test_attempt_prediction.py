"""An attempt's lease learns predicted against measured TTFT (issue 39's calibration); the prediction is admission's
for the very pick it made (issue 37: not computed twice), else the pool's own at the pick."""

from __future__ import annotations

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.context import RequestContext
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import parsed_context, routed
from gateway.upstream.attempt import Attempt

CONFIG = gateway_config([tier("t", ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"])])
ADMISSION = 0.123  # admission's prediction, unlike any the pool makes for an untried replica


async def admitted(pool: ReplicaPool) -> RequestContext:
    ctx = await routed(await parsed_context(CONFIG, {"model": "t", "messages": [{"role": "user", "content": "hi"}]}),
                       pool)
    ctx.route.predicted_ttft_s, ctx.route.predicted_on = ADMISSION, ctx.route.candidates[0]
    ctx.upstream.attempts = 1
    return ctx


def learned(ctx: RequestContext, pool: ReplicaPool, index: int = 0, **kwargs: bool) -> float | None:
    replica = ctx.route.candidates[index]
    with Attempt(ctx, pool, replica, **kwargs) as attempt:
        attempt.first_byte()
        attempt.answered()
    assert ctx.route.tier is not None
    return pool.state(replica, ctx.route.tier).predicted_ewma_s


@pytest.mark.asyncio
async def test_the_first_try_of_admissions_pick_learns_admissions_prediction() -> None:
    pool = ReplicaPool()
    ctx = await admitted(pool)
    assert learned(ctx, pool) == ADMISSION


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["other replica", "retry", "continuation", "no admission"])
async def test_any_other_try_predicts_from_the_pool(case: str) -> None:
    pool = ReplicaPool()
    ctx = await admitted(pool)
    assert ctx.route.tier is not None
    index = 1 if case == "other replica" else 0
    own = pool.predict(ctx.route.tier, ctx.route.candidates[index], ctx.prompt_tokens_est)
    assert own != ADMISSION
    if case == "retry":
        ctx.upstream.attempts = 2
    if case == "no admission":
        ctx.route.predicted_ttft_s = ctx.route.predicted_on = None
    found = learned(ctx, pool, index, **({"first": False} if case == "continuation" else {}))
    assert found == pytest.approx(own)
