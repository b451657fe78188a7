"""The Prometheus series behind the dashboard panels that the request metrics do not cover (response
cache results, SLO goodput, difficulty, cost and savings per tenant), so that the Grafana board
(deploy/grafana/) draws the same panels as GET /dashboard. Registered in the app's own registry
(gateway.metrics.promfast's lock-free series: observed on the event loop, rendered on scrape)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gateway.metrics.promfast import Counter, CounterChild, Histogram

if TYPE_CHECKING:
    from gateway.context import RequestContext

DIFFICULTY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class OutcomeSeries:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.cache = Counter("gateway_cache_requests", "Requests by response-cache result (off, bypass, miss, hit, "
                             "semantic_hit)", ("result",), registry=registry)
        self.slo = Counter("gateway_slo_requests", "Requests by tier and whether they were served (200) within "
                           "their tenant's TTFT SLO (no SLO: served counts as met)", ("tier", "result"),
                           registry=registry)
        self.difficulty = Histogram("gateway_difficulty", "The classifier's difficulty score of model 'auto' requests",
                                    buckets=DIFFICULTY_BUCKETS, registry=registry)
        self.tenant_cost = Counter("gateway_tenant_cost_usd", "Cost of served requests in USD, by tenant",
                                   ("tenant",), registry=registry)
        self.tenant_saved = Counter("gateway_tenant_saved_usd", "Saved against the baseline tier in USD, by tenant",
                                    ("tenant",), registry=registry)
        self._children: dict[tuple[str, str, str, bool], tuple[CounterChild, CounterChild, CounterChild,
                                                                CounterChild]] = {}
        self._difficulty = self.difficulty.labels()  # the one series of a metric without labels

    def observe(self, ctx: RequestContext, good: bool, saved_usd: float) -> None:
        tier = ctx.route.tier.name if ctx.route.tier is not None else "none"
        key = (tier, ctx.tenant_name, ctx.cache, good)
        children = self._children.get(key)
        if children is None:  # labels() builds a key: once per combination
            children = self._children[key] = (
                self.cache.labels(ctx.cache), self.slo.labels(tier, "met" if good else "missed"),
                self.tenant_cost.labels(ctx.tenant_name), self.tenant_saved.labels(ctx.tenant_name))
        cache, slo, cost, saved = children
        cache.inc()
        slo.inc()
        if ctx.result.cost_usd:
            cost.inc(ctx.result.cost_usd)
        if saved_usd > 0:  # a counter only goes up: a request dearer than the baseline saves nothing
            saved.inc(saved_usd)
        if ctx.route.difficulty is not None:
            self._difficulty.observe(ctx.route.difficulty)
