"""Prometheus view of the replica pool, read at scrape time (nothing on the request path)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.backends.breaker import STATE_CODES
from gateway.backends.pool import ReplicaPool


class PoolCollector(Collector):
    def __init__(self, pool: ReplicaPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        families = {
            "in_flight": GaugeMetricFamily("gateway_replica_in_flight", "Requests in flight", labels=["backend"]),
            "ttft": GaugeMetricFamily("gateway_replica_ttft_ewma_seconds", "EWMA of observed TTFT",
                                      labels=["backend"]),
            "tpot": GaugeMetricFamily("gateway_replica_tpot_ewma_seconds", "EWMA of observed TPOT",
                                      labels=["backend"]),
            "wait": GaugeMetricFamily("gateway_replica_predicted_wait_seconds",
                                      "Predicted TTFT of an empty prompt (queueing ahead of it)", labels=["backend"]),
            "healthy": GaugeMetricFamily("gateway_replica_healthy", "Last active health check passed (1)",
                                         labels=["backend"]),
            "breaker": GaugeMetricFamily("gateway_replica_circuit_state", "0 closed, 1 open, 2 half-open",
                                         labels=["backend"]),
            "waiting": GaugeMetricFamily("gateway_replica_backend_waiting",
                                         "Requests waiting inside the backend (its /metrics)", labels=["backend"]),
        }
        for name, state in self._pool.states().items():
            families["in_flight"].add_metric([name], state.in_flight)
            families["ttft"].add_metric([name], state.ttft_s or 0.0)
            families["tpot"].add_metric([name], state.tpot_s or 0.0)
            families["wait"].add_metric([name], state.predict_ttft(0))
            families["healthy"].add_metric([name], 1.0 if state.healthy else 0.0)
            families["breaker"].add_metric([name], STATE_CODES[state.breaker.state])
            families["waiting"].add_metric([name], state.load.waiting)
        yield from families.values()


def register(pool: ReplicaPool, registry: CollectorRegistry) -> None:
    registry.register(PoolCollector(pool))
