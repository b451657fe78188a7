"""The latency window of each scenario through its fleet (`fleet`), the recorded one read from the log.

TTFT figures are over the window's answered cache misses (a hit never reaches a replica, in the log or in
the simulation); shed counts (503 queue_full, queue_timeout, ...) are the window's. A request a scenario
refuses by policy (429, 4xx) never reaches the fleet; one the log shows shed, or failed upstream, on the
tier the scenario also chose is sent to the fleet, which decides again whether it is shed.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.config import GatewayConfig
from gateway.whatif.decide import HITS
from gateway.whatif.fleet import Arrival, Fleet
from gateway.whatif.physics import Fitted, Samples, fit
from gateway.whatif.records import SHED
from gateway.whatif.replay import RECORDED, Window
from gateway.whatif.summary import Tally


def fitted_physics(config: GatewayConfig, samples: Mapping[str, Samples]) -> dict[str, Fitted]:
    """Each chat tier of `config`'s routes with its physics fitted from the samples of its name."""
    return {tier.name: fit(tier, samples.get(tier.name)) for tier in config.routes.tiers if tier.endpoint == "chat"}


def record_window(window: Window, tally: Tally) -> None:
    """The recorded TTFTs and sheds of the window, from the log."""
    for row in window.rows:
        rec = row.rec
        tally.window_requests += 1
        if rec.refused in SHED:
            tally.shed[rec.refused or ""] += 1
        elif rec.served and rec.ttft_ms is not None and rec.cache not in HITS and rec.tier is not None:
            _ttft(tally, rec.tier, rec.tenant, rec.ttft_ms)


def simulate_window(name: str, config: GatewayConfig, window: Window, physics: Mapping[str, Fitted],
                    tally: Tally) -> None:
    """Scenario `name`'s window through its fleet; TTFTs and sheds into `tally`."""
    assert name != RECORDED
    arrivals: list[Arrival] = []
    for row in window.rows:
        decision, rec = row.decisions[name], row.rec
        tally.window_requests += 1
        if decision.tier is None or decision.cache in HITS or config.tiers[decision.tier].endpoint != "chat":
            continue
        if decision.refused is not None and decision.refused not in SHED:
            continue  # refused by policy (429, 4xx), or failed upstream as logged: no first token to time
        cached = rec.cached if decision.tier == rec.tier else 0
        arrivals.append(Arrival(rec.arrival, rec.tenant, decision.tier, decision.prompt - cached,
                                decision.completion))
    Fleet(config.routes, physics).run(arrivals)
    for request in arrivals:
        if request.shed is not None:
            tally.shed[request.shed] += 1
        elif request.ttft_ms is not None:
            _ttft(tally, request.tier, request.tenant, request.ttft_ms)


def _ttft(tally: Tally, tier: str, tenant: str, ttft_ms: float) -> None:
    tally.ttft[tier].add(ttft_ms)
    tally.tenant_ttft[tenant].add(ttft_ms)
    tally.overall_ttft.add(ttft_ms)
