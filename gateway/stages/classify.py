"""Classify: for model 'auto', predict each measured model's answer quality when the tenant routes by
`quality_floor`, and score the prompt's difficulty when its bands are needed.

The bands are needed when the tenant has them and no quality prediction is there to route on (the tenant
routes by bands, the gateway has no predictor, or the predictor failed). Neither model failing fails the
request: the failure is logged and the request takes the bands, or else the default tier.
"""

from __future__ import annotations

import structlog

from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.keyspace import tenant_scope
from gateway.types import AUTO_MODEL, DifficultyScorer, QualityPredictor, Reply

log = structlog.get_logger("gateway.classify")


class ClassifyStage:
    def __init__(self, scorer: DifficultyScorer | None, predictor: QualityPredictor | None = None) -> None:
        self._scorer = scorer
        self.predictor = predictor  # set again by a reload that loads one (gateway.state.Gateway.serve)

    def idle(self, config: GatewayConfig) -> bool:
        """No policy under `config` asks for a difficulty or a quality prediction: the stage does nothing."""
        return not any(p.quality_floor is not None or p.routing is not None for p in config.policies())

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        tenant = ctx.tenant
        if tenant is None or ctx.model_requested != AUTO_MODEL or ctx.endpoint == "embeddings":
            return None
        if self.predictor is not None and tenant.quality_floor is not None:
            try:
                ctx.route.quality = await self.predictor.predict(ctx.prompt_text(), scope=tenant_scope(tenant))
            except Exception as err:  # the predictor is an optimisation, never a reason to fail
                log.warning("quality_predictor_failed", request_id=ctx.request_id,
                            error=f"{type(err).__name__}: {err}")
            else:
                return None
        if self._scorer is None or tenant.routing is None:
            return None
        try:
            ctx.route.difficulty = await self._scorer.score(ctx.prompt_text(), scope=tenant_scope(tenant))
        except Exception as err:  # the classifier is an optimisation, never a reason to fail
            log.warning("classifier_failed", request_id=ctx.request_id, error=f"{type(err).__name__}: {err}")
        return None
