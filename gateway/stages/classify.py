"""Classify: score the prompt's difficulty for model 'auto' when the policy routes by bands.

A classifier failure never fails the request: it is logged and the request takes the default tier.
"""

from __future__ import annotations

import structlog

from gateway.context import RequestContext
from gateway.types import AUTO_MODEL, DifficultyScorer, Reply

log = structlog.get_logger("gateway.classify")


class ClassifyStage:
    def __init__(self, scorer: DifficultyScorer | None) -> None:
        self._scorer = scorer

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        routing = ctx.tenant.routing if ctx.tenant else None
        if self._scorer is None or ctx.model_requested != AUTO_MODEL or routing is None or ctx.endpoint == "embeddings":
            return None
        try:
            ctx.difficulty = await self._scorer.score(ctx.prompt_text())
        except Exception as err:  # the classifier is an optimisation, never a reason to fail
            log.warning("classifier_failed", request_id=ctx.request_id, error=f"{type(err).__name__}: {err}")
        return None
