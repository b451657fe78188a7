"""The app's state: what the HTTP handlers need, under one aiohttp app key (`GATEWAY`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.backends.pool import ReplicaPool
from gateway.cache.guard import RedisGuard
from gateway.cache.responses import ResponseCache
from gateway.client_limits import ClientLimits
from gateway.config import GatewayConfig
from gateway.config.reload import ConfigReloader
from gateway.limits.limiter import Limiter
from gateway.limits.replicas import Replicas
from gateway.metrics import GatewayMetrics
from gateway.pipeline import RequestPath
from gateway.stages.account import Accountant
from gateway.routing.session import SessionStage
from gateway.types import DifficultyScorer, QualityPredictor

if TYPE_CHECKING:  # OpenTelemetry is imported only when tracing is on
    from gateway.experiments.feedback import FeedbackLimiter, FeedbackStore, RequestOwners
    from gateway.experiments.shadow import ShadowSender
    from gateway.tracing import Tracing


@dataclass(slots=True)
class Gateway:
    """The serving config, the request path (set once the app's resources are open) and the shared parts."""

    config: GatewayConfig
    accountant: Accountant
    metrics: GatewayMetrics
    pool: ReplicaPool
    client_limits: ClientLimits = field(default_factory=ClientLimits)
    path: RequestPath | None = None
    redis: RedisGuard | None = None
    reloader: ConfigReloader | None = None
    scorer: DifficultyScorer | None = None
    predictor: QualityPredictor | None = None  # per-tier answer quality for quality_floor routing
    predictor_owned: bool = False  # the predictor was loaded by a reload (closed with the app), not given
    responses: ResponseCache | None = None
    replicas: Replicas | None = None
    tracing: Tracing | None = None
    owners: RequestOwners | None = None  # request id -> tenant and arm, for POST /v1/feedback
    feedback: FeedbackStore | None = None  # accepted feedback in Redis (None: logged only)
    feedback_limiter: FeedbackLimiter | None = None  # feedback posts per tenant a minute
    limiter: Limiter | None = None  # tenants' rate limits and budgets (the policy stage's; count_tokens's too)
    shadow: ShadowSender | None = None  # shadow comparisons' queue and workers
    sessions: SessionStage | None = None  # sticky-tier sessions (route stage; admin explain peeks)

    def prepare(self, config: GatewayConfig) -> None:
        """Slow work for a new config version, off the event loop (the reloader's `prepare`): its tokenizers, and
        the quality predictor when it is the first version a tenant's quality_floor needs it in (none was loaded
        at start); a predictor that does not load leaves those tenants on their bands, as at start."""
        self.accountant.prepare(config)
        if self.predictor is None:
            from gateway.routing.tools import serving_predictor

            self.predictor = serving_predictor(config, self.scorer)  # None when no tenant routes by quality
            self.predictor_owned = self.predictor is not None

    def serve(self, config: GatewayConfig) -> None:
        """Swap in a new config version: requests that start from now on use it; the replicas' and the
        admission gates' settings follow it at once, and the classify stage the predictor `prepare` loaded."""
        self.config = config
        self.pool.configure(config.routes)
        if self.path is not None:
            self.path.admission.configure(config)
            self.path.classify.predictor = self.predictor

    def close_predictor(self) -> None:
        """Close the predictor a reload loaded (one given to create_app is its giver's to close)."""
        if self.predictor is not None and self.predictor_owned:
            self.predictor.close()
            self.predictor, self.predictor_owned = None, False


GATEWAY = web.AppKey("gateway", Gateway)
