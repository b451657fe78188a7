"""Prometheus view of the replica pool, read at scrape time (nothing on the request path)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.backends.breaker import STATE_CODES
from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import ReplicaStats

GAUGES: tuple[tuple[str, str, Callable[[ReplicaStats], float]], ...] = (
    ("gateway_replica_in_flight", "Requests in flight", lambda s: s.in_flight),
    ("gateway_replica_ttft_ewma_seconds", "EWMA of observed TTFT", lambda s: s.ttft_s or 0.0),
    ("gateway_replica_tpot_ewma_seconds", "EWMA of observed TPOT", lambda s: s.tpot_s or 0.0),
    ("gateway_replica_predicted_wait_seconds", "Predicted TTFT of an empty prompt (queueing ahead of it)",
     lambda s: s.predict_ttft(0)),
    ("gateway_replica_healthy", "Last active health check passed (1)", lambda s: 1.0 if s.healthy else 0.0),
    ("gateway_replica_circuit_state", "0 closed, 1 open, 2 half-open", lambda s: STATE_CODES[s.breaker.state]),
    ("gateway_replica_error_rate", "EWMA of failed attempts (1 per failure, 0 per success)",
     lambda s: s.error_rate),
    ("gateway_replica_backend_running", "Requests running inside the backend (its /metrics)",
     lambda s: s.load.running),
    ("gateway_replica_backend_waiting", "Requests waiting inside the backend (its /metrics)",
     lambda s: s.load.waiting),
)


class PoolCollector(Collector):
    def __init__(self, pool: ReplicaPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        states = self._pool.states()
        for name, help_, read in GAUGES:
            family = GaugeMetricFamily(name, help_, labels=["backend"])
            for backend, state in states.items():
                family.add_metric([backend], read(state))
            yield family


def register(pool: ReplicaPool, registry: CollectorRegistry) -> None:
    registry.register(PoolCollector(pool))
