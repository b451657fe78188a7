"""create_app: the gateway as an aiohttp Application, its resources opened and closed in cleanup_ctx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.stages.account import Accountant
from gateway.stages.classify import ClassifyStage
from gateway.stages.parse import ParseStage
from gateway.stages.policy import PolicyStage
from gateway.stages.proxy import ProxyStage
from gateway.stages.route import RouteStage
from gateway.tokens import TokenCounters
from gateway.types import DifficultyScorer, Stage

BODY_CEILING = 64 * 1024 * 1024  # hard cap; the policy's max_body_bytes is the real limit


@dataclass(slots=True)
class Gateway:
    """What the handlers need: the serving config, the stages and the accounting."""

    config: GatewayConfig
    accountant: Accountant
    metrics: GatewayMetrics
    pool: ReplicaPool
    stages: tuple[Stage, ...] = field(default=())


GATEWAY = web.AppKey("gateway", Gateway)


def create_app(config: GatewayConfig, scorer: DifficultyScorer | None = None) -> web.Application:
    """The gateway app; `scorer` rates prompt difficulty for model 'auto' (None: always the default tier)."""
    from gateway import http  # the handlers import GATEWAY from here

    metrics, counters = GatewayMetrics(), TokenCounters()
    for tier in config.routes.tiers:
        counters.for_spec(tier.tokenizer)  # load tokenizers now, never on the request path
    gateway = Gateway(config, Accountant(counters, metrics), metrics, ReplicaPool())
    app = web.Application(client_max_size=BODY_CEILING)
    app[GATEWAY] = gateway

    async def upstream_session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            gateway.stages = (
                ParseStage(), PolicyStage(), ClassifyStage(scorer), RouteStage(gateway.pool),
                ProxyStage(session, gateway.pool),
            )
            yield

    app.cleanup_ctx.append(upstream_session)
    http.add_routes(app)
    return app
