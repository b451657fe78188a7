"""create_app: the gateway as an aiohttp Application, its resources opened and closed in cleanup_ctx."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from gateway import admin, http
from gateway.backends import collector
from gateway.backends.h1 import UpstreamClient
from gateway.backends.idle import IdleWatchdog
from gateway.backends.pool import ReplicaPool
from gateway.backends.probe import Prober
from gateway.cache.background import BackgroundWrites
from gateway.cache.connection import connect
from gateway.cache.embeddings import EmbeddingStore, Vectors
from gateway.cache.guard import RedisGuard
from gateway.cache.prefix import PrefixStore
from gateway.cache.responses import ResponseCache
from gateway.cache.semantic import SemanticIndex
from gateway.cache.semantic_cache import SemanticCache
from gateway.client_limits import ClientLimits
from gateway.config import GatewayConfig
from gateway.config.reload import ConfigReloader
from gateway.dashboard import routes as dashboard
from gateway.edge.accounted import unaccounted
from gateway.experiments.feedback import FeedbackLimiter, FeedbackStore, RequestOwners
from gateway.experiments.serving import (
    BackgroundEncoder, GatewaySend, OwnerRecorder, ShadowTap, admission_pressure,
)
from gateway.experiments.shadow import AgreementScorer, PairStore, ShadowSender
from gateway.limits.limiter import Limiter
from gateway.limits.replicas import Replicas
from gateway.metrics import GatewayMetrics
from gateway.pipeline import RequestPath
from gateway.routing.affinity import AffinityStage
from gateway.routing.detour import DetourStage
from gateway.routing.spill import SpillStage
from gateway.routing.ranking import RankStage
from gateway.routing.session import SessionStage
from gateway.routing.tiers import RouteStage
from gateway.routing.sessions import SessionStore
from gateway.stages.account import Accountant
from gateway.stages.admission import AdmissionStage
from gateway.stages.cache import CacheStage
from gateway.stages.classify import ClassifyStage
from gateway.stages.embed import EmbedStage
from gateway.stages.parse import ParseStage
from gateway.stages.policy import PolicyStage
from gateway.stages.proxy import ProxyStage
from gateway.state import GATEWAY, Gateway
from gateway.tokens import TokenCounters
from gateway.types import DifficultyScorer, QualityPredictor
from gateway.upstream.embeddings import RemoteEmbeddings
from gateway.upstream.escalate import EscalateStage
from gateway.upstream.hop import UpstreamHop

if TYPE_CHECKING:  # onnxruntime is imported only when a classifier is loaded
    from gateway.classifier.embedder import CachedEmbedder

BODY_CEILING = 64 * 1024 * 1024  # hard cap; the policy's max_body_bytes is the real limit


def create_app(
    config: GatewayConfig, scorer: DifficultyScorer | None = None, redis_url: str | None = None,
    config_files: tuple[Path, Path] | None = None, client_limits: ClientLimits | None = None,
    shadow_pairs: Path | None = None, predictor: QualityPredictor | None = None,
) -> web.Application:
    """The gateway app. `scorer` rates prompt difficulty for model 'auto' (None: always the default tier);
    `redis_url` enables the caches (None: no Redis, nothing cached); `config_files` (routes, policy) are
    watched and hot-reloaded (None: the config is fixed); `client_limits` bound how slow a client may be;
    `shadow_pairs` is the JSONL file shadow comparisons are appended to (None: Redis only, when there is Redis);
    `predictor` predicts each tier's answer quality for tenants routing by quality_floor (None: they use their
    bands, else the default tier)."""
    metrics = GatewayMetrics()
    limits = client_limits or ClientLimits()
    gateway = Gateway(config, Accountant(TokenCounters(), metrics), metrics, ReplicaPool(), limits, scorer=scorer,
                      predictor=predictor)
    gateway.pool.configure(config.routes)
    collector.register(gateway.pool, metrics.registry)
    gateway.accountant.prepare(config)  # load tokenizers now, never on the request path
    if config_files is not None:
        gateway.reloader = ConfigReloader(*config_files, apply=gateway.serve, prepare=gateway.prepare, serving=config)
    app = web.Application(client_max_size=BODY_CEILING, handler_args=limits.handler_args())
    app[GATEWAY] = gateway

    async def resources(app: web.Application) -> AsyncIterator[None]:
        # one client for all traffic to the replicas (requests, health probes, /metrics scrapes): their TLS,
        # timeouts and name cache apply everywhere (backends/h1.py)
        writes, watchdog = BackgroundWrites(), IdleWatchdog()
        upstream = UpstreamClient(on_resend=metrics.upstream_resends.inc)
        gateway.path, sentences = _request_path(gateway, upstream, redis_url, writes, watchdog, shadow_pairs)
        stop_watching = asyncio.Event()
        idle_sweeps, loops = _background(gateway, upstream, watchdog, stop_watching)
        try:
            yield
        finally:
            idle_sweeps.cancel()
            stop_watching.set()
            await asyncio.gather(*loops)
            await _close_experiments(gateway)
            await writes.drain()
            await upstream.close()
            gateway.close_predictor()
            if sentences is not None:
                await sentences.aclose()
            if gateway.redis is not None:
                await gateway.redis.client.aclose()

    app.cleanup_ctx.append(resources)
    app.cleanup_ctx.append(_traces)
    admin.add_routes(app)
    dashboard.add_routes(app)
    http.add_routes(app)  # last: its catch-all answers unknown paths
    if missing := unaccounted(app):  # every answer gets its line (gateway.edge.accounted)
        raise RuntimeError(f"routes that would write no request line: {', '.join(missing)}")
    return app


def _request_path(gateway: Gateway, upstream: UpstreamClient, redis_url: str | None,
                  writes: BackgroundWrites, watchdog: IdleWatchdog,
                  shadow_pairs: Path | None = None) -> tuple[RequestPath, CachedEmbedder | None]:
    """The stages over the app's resources (Redis when `redis_url` is set), and the sentence encoder
    the embedding tiers and the semantic cache share (None: neither needs one)."""
    config, pool, metrics, scorer = gateway.config, gateway.pool, gateway.metrics, gateway.scorer
    prefixes, semantic, sentences = None, None, None
    if redis_url:
        timeout_s = config.routes.redis.op_timeout_ms / 1000
        gateway.redis = RedisGuard(connect(redis_url), op_timeout_s=timeout_s, registry=metrics.registry)
        gateway.responses = ResponseCache(gateway.redis, writes)
        prefixes = PrefixStore(gateway.redis)
        if (shared := _share_embeddings(scorer, gateway.redis, gateway.responses, writes)) is not None:
            semantic, sentences = shared
    if sentences is None and any(t.embedder for t in config.routes.tiers):
        sentences = _sentences(scorer, gateway.redis)
    affinity = AffinityStage(prefixes, writes)
    rank = RankStage(pool, affinity)
    count_tokens = gateway.accountant.count_tokens
    admission = AdmissionStage(pool, metrics, rank)
    proxy = ProxyStage(UpstreamHop(upstream, pool, watchdog, metrics, count_tokens, gateway.accountant.counters))
    record_owner, shadow_tap = _experiments(gateway, admission, proxy, shadow_pairs)
    gateway.sessions = SessionStage(SessionStore(gateway.redis), writes.spawn)  # in process only without Redis
    path = RequestPath(
        parse=ParseStage(),
        policy=PolicyStage(_limiter(gateway, writes), record_owner),
        classify=ClassifyStage(scorer, gateway.predictor),
        route=RouteStage(),
        session=gateway.sessions,
        detour=DetourStage(pool),
        spill=SpillStage(pool, admission.wait, metrics),
        shadow=shadow_tap,
        cache=CacheStage(gateway.responses, semantic),
        affinity=affinity,
        rank=rank,
        admission=admission,
        embed=EmbedStage(sentences, count_tokens, RemoteEmbeddings(
            upstream, pool, metrics, Vectors(gateway.redis, writes) if gateway.redis is not None else None)),
        proxy=proxy,
        escalate=EscalateStage(proxy.hop, rank, admission, metrics),
        account=gateway.accountant,
    )
    return path, sentences


def _experiments(gateway: Gateway, admission: AdmissionStage, proxy: ProxyStage,
                 shadow_pairs: Path | None) -> tuple[OwnerRecorder, ShadowTap]:
    """Issue 22's parts on the request path: the request owners feedback is checked against, and the shadow
    comparisons (their agreement scored on a sentence encoder of their own, at the lowest CPU priority)."""
    gateway.owners = RequestOwners(gateway.redis)
    gateway.feedback = FeedbackStore(gateway.redis) if gateway.redis is not None else None
    gateway.feedback_limiter = FeedbackLimiter(  # the replicas' count: made by _limiter, just after
        gateway.redis, lambda: gateway.replicas.count if gateway.replicas is not None else 1)
    send = GatewaySend(lambda: gateway.config, gateway.pool, admission, proxy, gateway.accountant.count_tokens)
    gateway.shadow = ShadowSender(send, AgreementScorer(BackgroundEncoder()), PairStore(gateway.redis, shadow_pairs),
                                  admission_pressure(admission), metrics=gateway.metrics.shadow)
    gateway.shadow.start()
    return OwnerRecorder(gateway.owners), ShadowTap(gateway.shadow)


async def _close_experiments(gateway: Gateway) -> None:
    """Stop the shadow workers (jobs in flight are dropped), close an encoder they opened, write pending owners."""
    if gateway.shadow is not None:
        await gateway.shadow.aclose()
        embedder = gateway.shadow.scorer.embedder
        if isinstance(embedder, BackgroundEncoder):
            await embedder.aclose()
    if gateway.owners is not None:
        await gateway.owners.aclose()


async def _traces(app: web.Application) -> AsyncIterator[None]:
    """OpenTelemetry, when on: the exporter starts with the app, and what is left is sent when it stops."""
    from gateway.tracing import open_tracing

    gateway = app[GATEWAY]
    gateway.tracing = open_tracing(gateway.config.routes.tracing)
    yield
    if gateway.tracing is not None:
        await asyncio.to_thread(gateway.tracing.shutdown)


def _limiter(gateway: Gateway, writes: BackgroundWrites) -> Limiter:
    """The rate limiter, and the heartbeats that tell it how many replicas share a limit."""
    redis = gateway.config.routes.redis
    gateway.replicas = Replicas(gateway.redis, lambda: gateway.config.routes.redis.expected_replicas)
    gateway.limiter = Limiter(gateway.redis, writes, gateway.replicas, gateway.metrics,
                              timeout_s=redis.limits_timeout_ms / 1000)
    return gateway.limiter


def _background(gateway: Gateway, upstream: UpstreamClient, watchdog: IdleWatchdog,
                stop: asyncio.Event) -> tuple[asyncio.Task[None], list[asyncio.Task[None]]]:
    """The background loops: the idle sweeps (cancelled at the end), and those that end when `stop` is set
    (health probes, replica heartbeats, the config watcher)."""
    assert gateway.replicas is not None
    loops = [Prober(upstream, gateway.pool, lambda: gateway.config).run(stop), gateway.replicas.run(stop)]
    if gateway.reloader is not None:
        loops.append(gateway.reloader.watch(stop))
    return asyncio.create_task(watchdog.run()), [asyncio.create_task(loop) for loop in loops]


def _sentences(scorer: DifficultyScorer | None, guard: RedisGuard | None) -> CachedEmbedder:
    """The MiniLM sentence encoder of the embedding tiers (opened on first use), on the classifier's provider,
    behind the Redis embedding cache when there is Redis."""
    from gateway.classifier.difficulty import sentence_embedder

    provider = str(getattr(scorer, "provider", "CPUExecutionProvider"))
    return sentence_embedder(provider, store=EmbeddingStore(guard) if guard is not None else None)


def _share_embeddings(scorer: DifficultyScorer | None, guard: RedisGuard, responses: ResponseCache,
                      writes: BackgroundWrites) -> tuple[SemanticCache, CachedEmbedder] | None:
    """With the trained classifier: its features go to Redis (shared by gateway replicas), and the
    semantic cache gets the sentence encoder (opened when a policy first uses it), on the same provider.
    Without the classifier there is no semantic cache."""
    from gateway.classifier.difficulty import DifficultyClassifier

    if not isinstance(scorer, DifficultyClassifier):
        return None
    store = EmbeddingStore(guard)
    scorer.embedder.store = store
    sentences = _sentences(scorer, guard)
    return SemanticCache(SemanticIndex(guard, op_timeout_s=0.02), sentences.embedding, responses, writes), sentences
