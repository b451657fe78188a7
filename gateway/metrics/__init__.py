"""Prometheus metrics of one gateway app (its own registry: no process-global state). The gateway's own
series are gateway.metrics.promfast's lock-free ones, observed on the event loop and rendered on scrape.

Series that name a tenant (a `tenant` label: spend, savings, shadow comparisons) are served only to a scrape
that brings a metrics key (issue 37): `Authorization: Bearer <token>` where the token's SHA-256 is one of the
policy's `metrics_keys_sha256` or its admin key, or the token is the GATEWAY_METRICS_TOKEN environment
variable the gateway started with (Prometheus: `authorization: {type: Bearer, credentials_file: ...}` in the
scrape config, or a ServiceMonitor's `authorization.credentials` Secret). A scrape without a metrics key (no
token, or any other: a tenant's API key is not one) gets every other series (health, latency, admission) and
the header `x-gateway-metrics: tenant-series-omitted`: the tenant panels of a misconfigured Prometheus go empty,
never anyone's spend to an unauthenticated reader.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from gateway.dashboard.series import OutcomeSeries
from gateway.dashboard.window import LiveWindow
from gateway.metrics.promfast import Counter, CounterChild, Gauge, Histogram, HistogramChild

if TYPE_CHECKING:
    from gateway.config.policies import PolicyConfig

METRICS_TOKEN_ENV = "GATEWAY_METRICS_TOKEN"
TENANT_LABEL = "tenant"
EXPOSITION = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
AGREEMENT_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # a cosine at or below 0: le="0.0"

# requests, e2e, ttft, tpot and cost of one (tier, status)
Series = tuple[CounterChild, HistogramChild, HistogramChild, HistogramChild, CounterChild]


class GatewayMetrics:
    def __init__(self, token: str | None = None) -> None:
        """`token`: the metrics key (default: the GATEWAY_METRICS_TOKEN environment variable, read once here)."""
        token = token if token is not None else os.environ.get(METRICS_TOKEN_ENV)
        self._token_sha256 = _sha256(token) if token else None
        self.registry = CollectorRegistry()
        labels = ("tier", "status")
        self.requests = Counter(
            "gateway_requests", "Requests that reached the gateway", labels, registry=self.registry
        )
        self.ttft = Histogram(
            "gateway_ttft_seconds", "Time to first token", labels, buckets=LATENCY_BUCKETS, registry=self.registry
        )
        self.tpot = Histogram(
            "gateway_tpot_seconds", "Time per output token after the first", labels,
            buckets=TPOT_BUCKETS, registry=self.registry,
        )
        self.e2e = Histogram(
            "gateway_e2e_seconds", "Request latency end to end", labels, buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge("gateway_requests_in_flight", "Requests being served", registry=self.registry)
        self.upstream_failures = Counter(
            "gateway_upstream_failures", "Replica attempts that failed before the first byte", ("backend",),
            registry=self.registry,
        )
        self.upstream_resends = Counter(
            "gateway_upstream_resends", "Requests sent again on a new connection after a reused one closed "
            "unanswered (the replica may have received them twice)", registry=self.registry,
        )
        self.cost = Counter("gateway_cost_usd", "Cost of served requests in USD", ("tier",), registry=self.registry)
        self.retries = Counter(
            "gateway_retries", "Failover attempts: sent, or refused by the retry budget", ("result",),
            registry=self.registry,
        )
        self.admission_limit = Gauge(
            "gateway_admission_limit", "Current adaptive concurrency limit", ("tier",), registry=self.registry
        )
        self.admission_in_flight = Gauge(
            "gateway_admission_in_flight", "Requests holding an admission slot", ("tier",), registry=self.registry
        )
        self.queue_depth = Gauge(
            "gateway_admission_queue_depth", "Requests waiting for a slot", ("tier", "priority"),
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "gateway_admission_wait_seconds", "Time admitted requests waited in the queue", ("tier",),
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.shed = Counter(
            "gateway_shed", "Requests refused by admission control", ("tier", "reason"), registry=self.registry
        )
        self.brownouts = Counter(
            "gateway_brownouts", "Requests moved to a faster tier because theirs was saturated",
            ("from_tier", "to_tier"), registry=self.registry,
        )
        self.spills = Counter(
            "gateway_spills", "Model 'auto' requests served by another tier because theirs was predicted to miss the "
            "tenant's spill TTFT SLO (issue 39)", ("from_tier", "to_tier"), registry=self.registry,
        )
        self.spill_quality_loss = Counter(
            "gateway_spill_quality_loss", "Predicted answer quality given up by spills (sum; divide by gateway_spills "
            "for the mean)", ("from_tier", "to_tier"), registry=self.registry,
        )
        self.limits_local = Counter(
            "gateway_limits_local_decisions", "Rate-limit decisions taken on this replica's share, Redis unable to "
            "decide (reason: redis_down, redis_no_answer, no_redis)", ("reason",), registry=self.registry,
        )
        self.replicas = Gauge(
            "gateway_replicas", "Gateway replicas a limit is shared by while Redis is down (heartbeats, at least "
            "redis.expected_replicas)", registry=self.registry,
        )
        self._children: dict[tuple[str, int], Series] = {}
        self.live = LiveWindow()  # the dashboard's rolling 15 minutes, in process
        self.outcomes = OutcomeSeries(self.registry)  # the same panels for Grafana
        self.shadow = ShadowSeries(self.registry)

    def observe(
        self, tier: str, status: int, e2e_s: float, ttft_s: float | None, tpot_s: float | None, cost: float
    ) -> None:
        requests, e2e, ttft, tpot, spent = self._series(tier, status)
        requests.inc()
        e2e.observe(e2e_s)
        if ttft_s is not None:
            ttft.observe(ttft_s)
        if tpot_s is not None:
            tpot.observe(tpot_s)
        if cost:
            spent.inc(cost)

    def spill(self, from_tier: str, to_tier: str, quality_loss: float | None) -> None:
        """One request spilled from `from_tier` to `to_tier`, giving up `quality_loss` of predicted quality."""
        self.spills.labels(from_tier, to_tier).inc()
        if quality_loss is not None and quality_loss > 0:
            self.spill_quality_loss.labels(from_tier, to_tier).inc(quality_loss)

    def _series(self, tier: str, status: int) -> Series:
        """The labelled children of one (tier, status), looked up once (labels() builds a key)."""
        series = self._children.get((tier, status))
        if series is None:
            key = (tier, str(status))
            series = (self.requests.labels(*key), self.e2e.labels(*key), self.ttft.labels(*key),
                      self.tpot.labels(*key), self.cost.labels(tier))
            self._children[(tier, status)] = series
        return series

    def render(self, tenants: bool = True) -> bytes:
        """The exposition; without `tenants`, every series that names a tenant left out."""
        return generate_latest(self.registry if tenants else TenantFree(self.registry))

    def scrape(self, authorization: str | None, policy: PolicyConfig) -> web.Response:
        """GET /metrics: every series for a metrics key; without one (no token, or another key) those naming no
        tenant, marked by a header."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        keys = [*policy.metrics_keys_sha256, *filter(None, (policy.admin_api_key_sha256, self._token_sha256))]
        if token and keys:
            given = _sha256(token)
            if any(hmac.compare_digest(given, key) for key in keys):
                return web.Response(body=self.render(), headers={"Content-Type": EXPOSITION})
        return web.Response(body=self.render(tenants=False), headers={
            "Content-Type": EXPOSITION, "x-gateway-metrics": "tenant-series-omitted"})


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


class TenantFree:
    """A registry's metrics without the samples that carry a tenant label (a family left with none is dropped)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            kept = [sample for sample in metric.samples if TENANT_LABEL not in sample.labels]
            if len(kept) < len(metric.samples):
                if not kept:
                    continue
                metric.samples = kept
            yield metric


class ShadowSeries:
    """Shadow comparisons (gateway.experiments.shadow), recorded by the ShadowSender where it decides them: each
    sampled request's outcome (shadow.OUTCOMES), the agreement of the scored pairs, and what the reference (and
    judge) calls cost. Tenants and tiers come from the config, so the label sets stay bounded."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "gateway_shadow_requests", "Requests sampled for a shadow comparison, by outcome",
            ("tenant", "from_tier", "to_tier", "outcome"), registry=registry,
        )
        self.agreement = Histogram(
            "gateway_shadow_agreement", "Agreement (cosine of the sentence embeddings) of stored shadow pairs",
            ("tenant", "from_tier", "to_tier"), buckets=AGREEMENT_BUCKETS, registry=registry,
        )
        self.cost = Counter(
            "gateway_shadow_cost_usd", "Cost of the shadow reference and judge calls in USD (in no tenant's cost)",
            ("tenant", "to_tier"), registry=registry,
        )
        self._outcomes: dict[tuple[str, str, str, str], CounterChild] = {}

    def outcome(self, tenant: str, from_tier: str, to_tier: str, outcome: str) -> None:
        """One sampled request's end; cheap (a dict lookup): skipped_pressure is counted on the request path."""
        key = (tenant, from_tier, to_tier, outcome)
        child = self._outcomes.get(key)
        if child is None:  # labels() builds a key: once per combination
            child = self._outcomes[key] = self.requests.labels(*key)
        child.inc()

    def pair(self, tenant: str, from_tier: str, to_tier: str, agreement: float | None, cost_usd: float) -> None:
        """A pair whose `shadow` line was logged (off the request path): its agreement (when scored) and cost."""
        if agreement is not None:
            self.agreement.labels(tenant, from_tier, to_tier).observe(agreement)
        if cost_usd > 0:  # a counter only goes up
            self.cost.labels(tenant, to_tier).inc(cost_usd)
