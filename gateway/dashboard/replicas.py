"""The dashboard's replicas panel: each replica's live state as the gateway's ranking sees it.

Per replica: its health (`up`, `failing health checks`, `circuit open`, `circuit half-open`), requests
in flight from this gateway and those of them still waiting for their first token, the queue the
backend itself reports on /metrics (None when it reports none), the TTFT the ranking predicts for a
PREDICT_TOKENS-token prompt now, the TTFT measured (EWMA of first tokens seen, streams and server-timed
answers) beside what was predicted for those same requests when they were sent (EWMA), the prefill ratio
calibrated from the server's /metrics (tokens it prefilled per token sent: its prompt cache, template and
tokenizer), and the attempts sent to it since the gateway started."""

from __future__ import annotations

import time
from typing import Any

from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import ReplicaStats
from gateway.config import GatewayConfig

PREDICT_TOKENS = 100


def health(state: ReplicaStats) -> str:
    if not state.healthy:
        return "failing health checks"
    breaker = state.breaker.state
    if breaker == "open":
        return "circuit open"
    return "circuit half-open" if breaker == "half_open" else "up"


def replica_rows(pool: ReplicaPool, config: GatewayConfig) -> list[dict[str, Any]]:
    now = time.monotonic()
    rows = []
    for tier in config.routes.tiers:
        for replica in tier.replicas:
            state = pool.state(replica, tier)
            load = state.load
            rows.append({
                "tier": tier.name, "replica": replica.name, "health": health(state),
                "in_flight": state.in_flight, "awaiting_first_token": state.pending,
                "backend_queue": load.waiting if load.fresh(now) else None,
                "predicted_ttft_ms": round(pool.predict(tier, replica, PREDICT_TOKENS) * 1000, 1),
                "measured_ttft_ms": None if state.ttft_s is None else round(state.ttft_s * 1000, 1),
                # the same requests' predictions (like for like with measured), and the calibrated prefill ratio
                "predicted_sent_ttft_ms": None if state.predicted_ewma_s is None
                else round(state.predicted_ewma_s * 1000, 1),
                "prefill_ratio": None if state.prefill_ratio is None else round(state.prefill_ratio, 3),
                "sent": state.sent,
            })
    return rows
