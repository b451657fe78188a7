"""create_app: the gateway as an aiohttp Application, its resources opened and closed in cleanup_ctx."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from gateway.backends.pool import ReplicaPool
from gateway.backends.affinity import Affinity
from gateway.cache.background import BackgroundWrites
from gateway.cache.connection import connect
from gateway.cache.guard import RedisGuard
from gateway.cache.prefix import PrefixStore
from gateway.cache.responses import ResponseCache
from gateway.limits.limiter import Limiter
from gateway.config import GatewayConfig
from gateway.metrics import GatewayMetrics
from gateway.stages.account import Accountant
from gateway.stages.cache import CacheStage
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
    redis: RedisGuard | None = None


GATEWAY = web.AppKey("gateway", Gateway)


def create_app(
    config: GatewayConfig, scorer: DifficultyScorer | None = None, redis_url: str | None = None
) -> web.Application:
    """The gateway app. `scorer` rates prompt difficulty for model 'auto' (None: always the default tier);
    `redis_url` enables the caches (None: no Redis, nothing cached)."""
    from gateway import http  # the handlers import GATEWAY from here

    metrics, counters = GatewayMetrics(), TokenCounters()
    for tier in config.routes.tiers:
        counters.for_spec(tier.tokenizer)  # load tokenizers now, never on the request path
    gateway = Gateway(config, Accountant(counters, metrics), metrics, ReplicaPool())
    app = web.Application(client_max_size=BODY_CEILING)
    app[GATEWAY] = gateway

    async def resources(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            responses, affinity, writes = None, None, BackgroundWrites()
            if redis_url:
                timeout_s = config.routes.redis.op_timeout_ms / 1000
                gateway.redis = RedisGuard(connect(redis_url), op_timeout_s=timeout_s, registry=metrics.registry)
                responses = ResponseCache(gateway.redis, writes)
                affinity = Affinity(PrefixStore(gateway.redis), writes, gateway.pool)
            gateway.stages = (
                ParseStage(), PolicyStage(Limiter(gateway.redis, writes)), ClassifyStage(scorer),
                RouteStage(gateway.pool, affinity),
                CacheStage(responses), ProxyStage(session, gateway.pool),
            )
            try:
                yield
            finally:
                await writes.drain()
                if gateway.redis is not None:
                    await gateway.redis.client.aclose()

    app.cleanup_ctx.append(resources)
    http.add_routes(app)
    return app
