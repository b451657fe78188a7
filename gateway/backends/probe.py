"""Off the request path: active health checks and the backends' own load, on an interval.

Both go through the upstream client every request to the replica takes (`upstream.fetch`): the replica's own
TLS settings (CA bundle, client certificate, `verify`), key, name cache and pooled connections.

Health: `GET {replica.url}/models` (every OpenAI-compatible server has it) every
`balancing.health_interval_s`; a failure takes the replica out of the ranking until one passes. A
probe that times out while the gateway has requests in flight on the replica changes nothing: the
server is busy (llama.cpp answers only between two generations), and those requests say if it is not.
Load: `GET /metrics` at the server's root every `scrape_interval_s`, read with vLLM's names
(`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`; SGLang and
the emulator speak them too) or llama.cpp's `llama-server --metrics` ones (`llamacpp:requests_processing`:
busy slots, `llamacpp:requests_deferred`: requests waiting for a slot; it reports no KV-cache use). A
server without any of them is asked again only every minute.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from gateway.backends.h1 import ClientFailure, UpstreamClient
from gateway.backends.pool import ReplicaPool
from gateway.backends.stats import BackendLoad
from gateway.backends.upstream import fetch
from gateway.config import GatewayConfig, Replica

UNSUPPORTED_RETRY_S = 60.0
PROBE_TIMEOUT_S = 2.0
GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_usage",
    "vllm:gpu_cache_usage_perc": "kv_usage",
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
}
PREFIXES = ("vllm:", "llamacpp:")
PREFILLED = "llamacpp:prompt_tokens_total"  # prompt tokens prefilled since start (its prompt cache's hits left out)

log = structlog.get_logger("gateway.probe")


def parse_load(text: str, at: float) -> BackendLoad | None:
    """The vLLM or llama.cpp gauges of a Prometheus text page, summed over label sets; None when it has none."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIXES):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field = "prompt_tokens" if name == PREFILLED else GAUGES.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if field == "kv_usage":
            found[field] = max(found.get(field, 0.0), value)
        else:
            found[field] = found.get(field, 0.0) + value
    if "running" not in found and "waiting" not in found:
        return None
    return BackendLoad(found.get("running", 0.0), found.get("waiting", 0.0), found.get("kv_usage", 0.0), at,
                       prompt_tokens=found.get("prompt_tokens"))


class Prober:
    def __init__(self, client: UpstreamClient, pool: ReplicaPool, config: Callable[[], GatewayConfig]) -> None:
        self._client = client
        self._pool = pool
        self._config = config
        self._no_metrics_until: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until `stop` is set, each kind of check on its own interval (0: that check is off)."""
        due = {"health": 0.0, "scrape": 0.0}
        while not stop.is_set():
            settings = self._config().routes.balancing
            intervals = {"health": settings.health_interval_s, "scrape": settings.scrape_interval_s}
            checks = {"health": self.check_health, "scrape": self.scrape}
            now = time.monotonic()
            jobs = []
            for kind, interval in intervals.items():
                if interval and now >= due[kind]:
                    due[kind] = now + interval
                    jobs += [checks[kind](tier, replica) for tier, replica in self._replicas()]
            if jobs:
                await asyncio.gather(*jobs)
            pending = [due[kind] for kind, interval in intervals.items() if interval]
            sleep_s = min(pending, default=time.monotonic() + 1.0) - time.monotonic()
            try:
                await asyncio.wait_for(stop.wait(), timeout=max(0.05, sleep_s))
            except TimeoutError:
                pass

    def _replicas(self) -> list[tuple[str, Replica]]:
        return [(t.name, r) for t in self._config().routes.tiers for r in t.replicas]

    async def check_health(self, tier: str, replica: Replica) -> None:
        state = self._pool.state(replica, self._config().tiers.get(tier))
        try:
            status, _ = await fetch(self._client, replica, "/models", PROBE_TIMEOUT_S)
            healthy = status < 500
        except (ClientFailure, TimeoutError, ValueError) as err:
            # busy is not down: llama.cpp answers /models only between two generations
            healthy = isinstance(err, TimeoutError) and state.in_flight > 0 and state.healthy
        if healthy != state.healthy:
            log.warning("replica_health_changed", backend=replica.name, healthy=healthy)
        state.healthy, state.checked_at = healthy, time.monotonic()

    async def scrape(self, tier: str, replica: Replica) -> None:
        now = time.monotonic()
        if self._no_metrics_until.get(replica.name, 0.0) > now:
            return
        try:
            status, body = await fetch(self._client, replica, "/metrics", PROBE_TIMEOUT_S, root=True)
            text = body.decode() if status == 200 else ""
        except (ClientFailure, TimeoutError, ValueError, UnicodeDecodeError):
            return  # the health check speaks for an unreachable server
        load = parse_load(text, time.monotonic())
        if load is None:
            self._no_metrics_until[replica.name] = now + UNSUPPORTED_RETRY_S
            return
        self._pool.state(replica, self._config().tiers.get(tier)).observe_load(load)
