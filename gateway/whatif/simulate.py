"""The latency window of each scenario through its fleet (`fleet`), the recorded one read from the log.

TTFT figures are over the window's answered cache misses (a hit never reaches a replica, in the log or in
the simulation); shed counts (503 queue_full, queue_timeout, ...) are the window's. A request a scenario
refuses by policy (429, 4xx) never reaches the fleet; one the log shows shed, or failed upstream, on the
tier the scenario also chose is sent to the fleet, which decides again whether it is shed.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping

from gateway.config import GatewayConfig
from gateway.whatif.decide import HITS
from gateway.whatif.fleet import Arrival, Fleet
from gateway.whatif.physics import MIN_SAMPLES, Fitted, QuantileMap, Samples, cpu_served, fit
from gateway.whatif.records import SHED, Logged
from gateway.whatif.replay import RECORDED, Window
from gateway.whatif.summary import Tally


@dataclasses.dataclass(frozen=True, slots=True)
class FleetFit:
    """What the log's own window says beyond each tier's profile (`fit_fleet`): per tier, the decode step time at
    batch 1 (`tpot_1`, seconds) and the maps (`physics.QuantileMap`), keyed (tier, kind): KINDS; under POOLED, all
    tiers'."""

    tpot_1: Mapping[str, float]
    maps: Mapping[tuple[str, str], QuantileMap]


POOLED = ""  # FleetFit.maps' tier of all tiers together
NO_FIT = FleetFit({}, {})
KINDS = ("stream", "whole", "busy")  # a streamed first token, a whole answer's last, the slot held to the end
MAP_PASSES = 2  # fleet runs with the maps in place, each refitting them against its own simulated TTFTs


def fitted_physics(config: GatewayConfig, samples: Mapping[str, Samples],
                   fleet: FleetFit = NO_FIT) -> dict[str, Fitted]:
    """Each chat tier of `config`'s routes with its physics fitted from the samples of its name, then `fleet`'s decode
    speed and TTFT maps (a tier without its own map of a kind: all tiers' pooled)."""
    fitted = {tier.name: fit(tier, samples.get(tier.name)) for tier in config.routes.tiers if tier.endpoint == "chat"}
    maps = fleet.maps
    out = {}
    for name, f in fitted.items():
        tpot_1 = fleet.tpot_1.get(name)
        profile = f.profile if tpot_1 is None else dataclasses.replace(f.profile, tpot_1_s=tpot_1)
        out[name] = _mapped(dataclasses.replace(f, profile=profile), name, maps)
    return out


def _mapped(fitted: Fitted, name: str, maps: Mapping[tuple[str, str], QuantileMap]) -> Fitted:
    """`fitted` with the tier's maps, else all tiers' pooled."""
    stream, whole, busy = (maps.get((name, kind)) or maps.get((POOLED, kind)) for kind in KINDS)
    return dataclasses.replace(fitted, stream_map=stream, whole_map=whole, busy_map=busy)


def fit_fleet(config: GatewayConfig, window: Window, samples: Mapping[str, Samples]) -> FleetFit:
    """The window replayed as the log routed it (every request that reached a replica, whole answers too, and the
    ones the log shows shed in the queue, which the replay sends to the fleet too: the load is the replay's) through
    the fleet of `config` (the routes that produced the log):

    1. with no overhead, each tier's tpot_1 scaled so that the median simulated TPOT of its streamed requests is the
       median logged one (the fit's tpot_1 is the least loaded requests' TPOT, which still holds some batching the
       engine adds again); a CPU-served tier's (`physics.cpu_served`) instead so that the median time from admission
       to the answer's end is the logged one (e2e less the queue: how long the gateway held the slot), over all its
       answers, streamed or whole: llama.cpp on shared cores decodes a whole answer faster per token than the
       streamed TPOT says, and a slot cannot be freed before its engine's last token, so an engine slower than the
       log holds the slots longer than the log did and queues requests the log admitted at once;
    2. with the rescaled decode, each tier's maps (`physics.QuantileMap`), quantile to quantile, all from admission
       (the queue is the simulation's to time): a streamed request's simulated first token onto its logged TTFT, a
       whole answer's last token onto its logged TTFT, and the engine's last token onto the logged end of the answer
       (e2e: how long the gateway held the slot); then MAP_PASSES times: the window again with the maps in place
       (the slots held longer and the admission gate's samples change the queue), the maps refitted on that run,
       and a CPU-served tier's decode scaled again as in 1 (the maps changed the queue, so the engines' batches)."""
    physics = {name: dataclasses.replace(f, overhead_s=0.0) for name, f in fitted_physics(config, samples).items()}
    arrivals: list[tuple[Logged, Arrival]] = []
    for row in window.rows:
        rec = row.rec
        if rec.tier in physics and rec.cache not in HITS and (rec.served or rec.status == 499 or rec.refused in SHED):
            arrivals.append((rec, Arrival(rec.arrival, rec.tenant, rec.tier, rec.prompt - rec.cached,
                                          rec.completion, rec.stream)))
    tpot_1: dict[str, float] = {}
    maps: dict[tuple[str, str], QuantileMap] = {}
    by_hold = {tier.name for tier in config.routes.tiers if cpu_served(tier)}  # decode fitted on the slot's hold
    for step in range(2 + MAP_PASSES):
        runs = [(rec, dataclasses.replace(a)) for rec, a in arrivals]
        Fleet(config.routes, physics).run(a for _, a in runs)
        ratios: dict[str, list[float]] = {}
        found: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        for rec, arrival in runs:
            if not rec.served:
                continue
            if arrival.tier in by_hold:
                if arrival.done_s and rec.e2e_ms > rec.queue_ms:
                    ratios.setdefault(arrival.tier, []).append((rec.e2e_ms - rec.queue_ms) / 1000 / arrival.done_s)
            elif rec.stream and rec.tpot_ms is not None and arrival.tpot_ms:
                ratios.setdefault(arrival.tier, []).append(rec.tpot_ms / arrival.tpot_ms)
            pairs: list[tuple[str, float | None, float | None]] = [("busy", arrival.done_s, rec.e2e_ms)]
            pairs.append(("stream" if rec.stream else "whole", arrival.sim_s, rec.ttft_ms))
            for kind, sim_s, logged_ms in pairs:  # from admission, in both
                if sim_s is None or logged_ms is None:
                    continue
                for tier in (arrival.tier, POOLED):
                    sim, logged = found.setdefault((tier, kind), ([], []))
                    sim.append(sim_s)
                    logged.append(max(0.0, logged_ms - rec.queue_ms) / 1000)
        for name, values in ratios.items():
            if len(values) >= MIN_SAMPLES and (step == 0 or name in by_hold):
                profile = physics[name].profile
                tpot_1[name] = profile.tpot_1_s * statistics.median(values)
                physics[name] = dataclasses.replace(physics[name],
                                                    profile=dataclasses.replace(profile, tpot_1_s=tpot_1[name]))
        if step == 0:
            continue
        maps = {key: m for key, (sim, logged) in found.items() if (m := QuantileMap.fit(sim, logged)) is not None}
        physics = {name: _mapped(f, name, maps) for name, f in physics.items()}
    return FleetFit(tpot_1, maps)


def record_window(window: Window, tally: Tally) -> None:
    """The recorded TTFTs and sheds of the window, from the log."""
    for row in window.rows:
        rec = row.rec
        tally.window_requests += 1
        if rec.refused in SHED:  # the window's count stands for the pass's (`figures` adds them up)
            tally.shed[rec.refused or ""] += 1
            tally.refused[rec.refused or ""] -= 1
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
        if decision.refused in SHED:  # the fleet decides it again: its count replaces the pass's
            tally.refused[decision.refused or ""] -= 1
        if decision.tier is None or decision.cache in HITS or config.tiers[decision.tier].endpoint != "chat":
            continue
        if decision.refused is not None and decision.refused not in SHED:
            continue  # refused by policy (429, 4xx), or failed upstream as logged: no first token to time
        cached = rec.cached if decision.tier == rec.tier else 0
        arrivals.append(Arrival(rec.arrival, rec.tenant, decision.tier, decision.prompt - cached,
                                decision.completion, rec.stream))
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
