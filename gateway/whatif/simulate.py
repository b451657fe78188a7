"""The latency window of each scenario through its fleet (`fleet`), the recorded one read from the log.

TTFT figures are over the window's answered cache misses (a hit never reaches a replica, in the log or in
the simulation); shed counts (503 queue_full, queue_timeout, ...) are the window's. A request a scenario
refuses by policy (429, 4xx) never reaches the fleet; one the log shows shed, or failed upstream, on the
tier the scenario also chose is sent to the fleet, which decides again whether it is shed.

The window is replayed by an ensemble (`fit_fleet`, `simulate_ensemble`). The fit's estimates are medians and
fits over samples of the log: each tier's decode step (the median of the logged holds or TPOTs over the simulated
ones) and a CPU-served machine's contention, batch slopes and external speed (`host_speeds`, from its answers). A
log's TTFT p50 often lies in a gap between streamed first tokens and whole or queued answers, with a few of its
requests near it: which ones the replayed queue catches moves with a change of the decode step far inside its
sampling error (0.5 % moves a p50 by up to 19 points on the llama.cpp logs of docs/BENCHMARKS.md), so one replay
with the point estimates is one draw of an uncertain figure. Each of the ensemble's `ensemble_size` draws redoes
the fit with every sample an estimate is taken from replaced by a bootstrap resample (seeded: a rerun gives the
same report): each machine's answers, so h, the slopes and the external factors are refitted together, and at
each of the fit's steps, each tier's decode ratios; the maps are refitted in the draw's own passes, so each draw
still reproduces the log's TTFT distribution as the point fit does and the draws differ where the fit cannot pin
them. Each draw replays the window once; a figure's TTFT p50 / p99 is the median over the replays of each one's
(`summary.Tally.replays`), a shed count the mean. On the llama.cpp logs a single replay's p50 spreads 1-10 points
(SD) across the draws; the median of 16 has about a third of that as its own error. The number of draws K is
bounded by their cost, which is engine steps (each draw: 4 fit runs and a replay per scenario, ~2 us a step): K =
ENSEMBLE_STEPS // the steps of the point fit's last run of the window, 1 to REPLAYS, so the ensemble adds at most
about 5 s. A small window, whose fit is the least certain and whose p50 the fewest requests decide, gets 16 (the
llama.cpp logs of 240-480 requests, 10,000-24,000 steps: 3-4.5 s a run instead of 0.3-0.5 s on the shared 2-core
machine); the emulator fleet's 1,200 requests (38,000 steps) 10; the 100,000-line benchmark's window 3; the 1 M-line
benchmark's (6,087 requests) is replayed once, as the point fit.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

from gateway.config import GatewayConfig
from gateway.whatif.decide import HITS
from gateway.whatif.fleet import Arrival, Fleet
from gateway.whatif.physics import (MIN_SAMPLES, Answer, Fitted, HostSpeed, QuantileMap, Samples, cpu_served, fit,
                                    fit_sharing, machine)
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
    hosts: Mapping[str, HostSpeed] = dataclasses.field(default_factory=dict)  # by machine (`machine`)
    tier_hosts: Mapping[str, HostSpeed] = dataclasses.field(default_factory=dict)  # by tier: its own answers'
    batch_slope: Mapping[str, float] = dataclasses.field(default_factory=dict)  # a CPU-served tier's, fitted
    draws: tuple[FleetFit, ...] = ()  # the ensemble (`fit_fleet`): none, one replay of this fit

    def members(self) -> list[FleetFit]:
        """The fits the window is replayed with: the ensemble's draws, else this fit alone."""
        return list(self.draws) or [self]


T = TypeVar("T")
POOLED = ""  # FleetFit.maps' tier of all tiers together
NO_FIT = FleetFit({}, {})
KINDS = ("stream", "whole", "busy")  # a streamed first token, a whole answer's last, the slot held to the end
MAP_PASSES = 2  # fleet runs with the maps in place, each refitting them against its own simulated TTFTs
REPLAYS = 16  # the ensemble's draws at most (module docstring)
ENSEMBLE_STEPS = 400_000  # the draws times the engine steps of one replay of the log's window, at most
ENSEMBLE_SEED = 40  # the bootstrap's: a rerun draws the same ensemble


def fitted_physics(config: GatewayConfig, samples: Mapping[str, Samples],
                   fleet: FleetFit = NO_FIT) -> dict[str, Fitted]:
    """Each chat tier of `config`'s routes with its physics fitted from the samples of its name, then `fleet`'s decode
    speed and TTFT maps (a tier without its own map of a kind: all tiers' pooled); a CPU-served tier its speed over
    the window (`fleet.tier_hosts`, else its machine's, `fleet.hosts`), its fitted batch slope and no busy map
    (`physics` module docstring)."""
    tiers = {tier.name: tier for tier in config.routes.tiers if tier.endpoint == "chat"}
    maps = fleet.maps
    out = {}
    for name, tier in tiers.items():
        f = fit(tier, samples.get(name))
        tpot_1 = fleet.tpot_1.get(name)
        profile = f.profile if tpot_1 is None else dataclasses.replace(f.profile, tpot_1_s=tpot_1)
        host = None
        if cpu_served(tier):
            host = fleet.tier_hosts.get(name) or fleet.hosts.get(machine(tier))
            profile = dataclasses.replace(profile, batch_slope=fleet.batch_slope.get(name, profile.batch_slope))
        out[name] = _mapped(dataclasses.replace(f, profile=profile, host=host), name, maps, cpu_served(tier))
    return out


def _mapped(fitted: Fitted, name: str, maps: Mapping[tuple[str, str], QuantileMap], cpu: bool) -> Fitted:
    """`fitted` with the tier's maps, else all tiers' pooled; a CPU-served tier (`cpu`) without a busy map."""
    stream, whole, busy = (maps.get((name, kind)) or maps.get((POOLED, kind)) for kind in KINDS)
    return dataclasses.replace(fitted, stream_map=stream, whole_map=whole, busy_map=None if cpu else busy)


@dataclasses.dataclass(frozen=True, slots=True)
class HostFit:
    """What `host_speeds` measures of the machines that serve CPU-served tiers."""

    machines: dict[str, HostSpeed]  # by machine (`physics.machine`): from all its tiers' answers
    tiers: dict[str, HostSpeed]  # by tier: from its own answers (its replicas' external speed)
    batch_slope: dict[str, float]  # by tier, where the log shows enough of its answers sharing a replica


def host_speeds(config: GatewayConfig, window: Window, physics: Mapping[str, Fitted]) -> HostFit:
    """Each machine's speed over the window (`physics.HostSpeed`), from the answers the log shows on its CPU-served
    tiers' replicas (`config`: the routes that produced the log). An answer ran on its replica from its admission
    (arrival + queue wait) to its end (e2e); beside it, the other answers the log shows on that replica then (the
    time-average of their number over its run, `c`). What its engine would take: its uncached prompt at the tier's
    prefill speed and its output at tpot_1 x (1 + s x c) a token (`physics[tier]`: the engine's model of one
    replica, s its batch slope); its slowdown is its logged hold over that. The machine's other replicas busy
    meanwhile (each the share of the answer's run it held any answer: the time-average of their number) are the
    gateway's own load on the cores: `physics.fit_sharing` fits how much each one slows a step (h) and each tier's
    batch slope s from the answers, and the slowdown less that, 1 + h x others, divided by its tier's median (what
    the fleet fit's decode speed takes up), is the external speed: > 1 when the machine ran the answer slower than
    the gateway's own load says. Measured per tier, from its own answers (`HostFit.tiers`): the replicas of a q4
    and of an f16 model on the same cores are not slowed alike by the same moment's other work (compute- and
    memory-bound kernels), and what of a tier's own load the model misses stays with it instead of slowing the
    other tier's answers; and per machine from all its answers (`HostFit.machines`), for a tier without its own."""
    return _host_fit(_answers(config, window, physics), physics)


Measured = dict[str, list[tuple[float, float, Answer]]]  # by machine: each answer's (start, end, figures)


def _answers(config: GatewayConfig, window: Window, physics: Mapping[str, Fitted]) -> Measured:
    """The answers `host_speeds` fits on, by machine."""
    tiers = {tier.name: tier for tier in config.routes.tiers if cpu_served(tier) and tier.name in physics}
    runs: dict[str, list[tuple[float, float]]] = {}  # by replica: every answer that occupied it
    hosts: dict[str, str] = {}  # each replica's machine
    answers: list[tuple[str, str, float, float, Logged]] = []
    for row in window.rows:
        rec = row.rec
        if rec.tier not in tiers or rec.backend is None or rec.cache in HITS or rec.e2e_ms <= rec.queue_ms:
            continue
        if not (rec.served or rec.status == 499):
            continue
        start, end = rec.arrival + rec.queue_ms / 1000, rec.arrival + rec.e2e_ms / 1000
        runs.setdefault(rec.backend, []).append((start, end))
        hosts[rec.backend] = machine(tiers[rec.tier])
        if rec.served:
            answers.append((rec.tier, rec.backend, start, end, rec))
    busy = {backend: _Occupancy(spans) for backend, spans in runs.items()}
    held = {backend: _Occupancy(_union(spans)) for backend, spans in runs.items()}  # 1 while any answer runs
    measured: Measured = {}
    for name, backend, start, end, rec in answers:
        p = physics[name].profile
        beside = max(0.0, busy[backend].integral(start, end) / (end - start) - 1)  # the answer itself is one
        host = hosts[backend]
        others = sum(occupancy.integral(start, end) for other, occupancy in held.items()
                     if other != backend and hosts[other] == host) / (end - start)
        measured.setdefault(host, []).append((start, end, Answer(
            name, (start + end) / 2, others, beside, end - start, max(0, rec.prompt - rec.cached) / p.prefill_tps,
            max(1, rec.completion) * p.tpot_1_s)))
    return measured


def _host_fit(measured: Measured, physics: Mapping[str, Fitted]) -> HostFit:
    """`host_speeds` fitted on `measured`."""
    out = HostFit({}, {}, {})
    for host, values in measured.items():
        h, slopes = fit_sharing([answer for _, _, answer in values])
        out.batch_slope.update(slopes)
        external: dict[str, list[tuple[float, float, float]]] = {}
        for a, b, answer in values:
            slope = slopes.get(answer.tier, physics[answer.tier].profile.batch_slope)
            model = answer.prefill + answer.decode * (1 + slope * answer.beside)
            external.setdefault(answer.tier, []).append((a, b, answer.hold / model / (1 + h * answer.others)))
        spans: list[tuple[float, float, float]] = []
        for name, rows in external.items():
            typical = statistics.median(r for _, _, r in rows)
            own = [(a, b, r / typical) for a, b, r in rows]
            spans.extend(own)
            if (speed := HostSpeed.fit(own, h)) is not None:
                out.tiers[name] = speed
        if (speed := HostSpeed.fit(spans, h)) is not None:
            out.machines[host] = speed
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """`spans` (start, end) merged where they overlap: when at least one runs."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class _Occupancy:
    """How many of `spans` (start, end) run at each moment, and its integral over an interval."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        self.times: list[float] = []
        self.counts: list[int] = []
        self.before: list[float] = []  # the integral up to each time
        count, total = 0, 0.0
        for at, step in events:
            if self.times:
                total += self.counts[-1] * (at - self.times[-1])
            count += step
            self.times.append(at)
            self.counts.append(count)
            self.before.append(total)

    def _upto(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return 0.0 if i < 0 else self.before[i] + self.counts[i] * (t - self.times[i])

    def integral(self, start: float, end: float) -> float:
        return self._upto(end) - self._upto(start)


def fit_fleet(config: GatewayConfig, window: Window, samples: Mapping[str, Samples],
              replays: int | None = None) -> FleetFit:
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
       and a CPU-served tier's decode scaled again as in 1 (the maps changed the queue, so the engines' batches).

    Before 1, each machine's speed over the window (`host_speeds`, from the log alone), in place in every run for its
    CPU-served tiers, which get no busy map: their slots are held to the engine's last token, at the machine's
    speed of the time (a rank map of the holds would give the log's slowest holds, which ran when the machine was
    slow, to the requests the simulation finds slowest, its most concurrent ones: longer holds where the simulated
    queue already is, and a queue the log did not have)."""
    physics = {name: dataclasses.replace(f, overhead_s=0.0) for name, f in fitted_physics(config, samples).items()}
    measured = _answers(config, window, physics)
    arrivals: list[tuple[Logged, Arrival]] = []
    for row in window.rows:
        rec = row.rec
        if rec.tier in physics and rec.cache not in HITS and (rec.served or rec.status == 499 or rec.refused in SHED):
            arrivals.append((rec, Arrival(rec.arrival, rec.tenant, rec.tier, rec.prompt - rec.cached,
                                          rec.completion, rec.stream)))
    point, steps = _fit(config, arrivals, physics, measured, None)
    count = ensemble_size(steps) if replays is None else replays
    if count <= 1:
        return point
    rng = np.random.default_rng(ENSEMBLE_SEED)
    return dataclasses.replace(point, draws=tuple(_fit(config, arrivals, physics, measured, rng)[0]
                                                  for _ in range(count)))


def ensemble_size(steps: int) -> int:
    """How many draws the ensemble of a window whose replay runs `steps` engine steps has (module docstring)."""
    return max(1, min(REPLAYS, ENSEMBLE_STEPS // max(1, steps)))


def _resampled(values: Sequence[T], rng: np.random.Generator | None) -> Sequence[T]:
    """`values`, or (`rng`) as many drawn from them with replacement: a bootstrap sample."""
    return values if rng is None else [values[i] for i in rng.integers(0, len(values), len(values))]


def _fit(config: GatewayConfig, arrivals: list[tuple[Logged, Arrival]], physics: Mapping[str, Fitted],
         measured: Measured, rng: np.random.Generator | None) -> tuple[FleetFit, int]:
    """`fit_fleet`'s steps from the log's `arrivals`, the tiers' `physics` and the CPU-served answers (`measured`);
    with `rng`, one draw of the ensemble: each sample an estimate is taken from (each machine's answers, each tier's
    decode ratios) a bootstrap resample of it. Returns the fit and the engine steps of its last fleet run."""
    physics = dict(physics)
    cpu = {tier.name: tier for tier in config.routes.tiers if cpu_served(tier) and tier.name in physics}
    hosts = _host_fit({host: list(_resampled(answers, rng)) for host, answers in measured.items()}, physics)
    for name, cpu_tier in cpu.items():
        physics[name] = dataclasses.replace(
            physics[name], host=hosts.tiers.get(name) or hosts.machines.get(machine(cpu_tier)),
            profile=dataclasses.replace(physics[name].profile,
                                        batch_slope=hosts.batch_slope.get(name, physics[name].profile.batch_slope)))
    tpot_1: dict[str, float] = {}
    maps: dict[tuple[str, str], QuantileMap] = {}
    by_hold = set(cpu)  # decode fitted on the slot's hold
    steps = 0
    for step in range(2 + MAP_PASSES):
        runs = [(rec, dataclasses.replace(a)) for rec, a in arrivals]
        fleet = Fleet(config.routes, physics)
        fleet.run(a for _, a in runs)
        steps = fleet.steps
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
            pairs: list[tuple[str, float | None, float | None]] = [("stream" if rec.stream else "whole",
                                                                    arrival.sim_s, rec.ttft_ms)]
            if arrival.tier not in by_hold:
                pairs.append(("busy", arrival.done_s, rec.e2e_ms))
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
                tpot_1[name] = profile.tpot_1_s * statistics.median(_resampled(values, rng))
                physics[name] = dataclasses.replace(physics[name],
                                                    profile=dataclasses.replace(profile, tpot_1_s=tpot_1[name]))
        if step == 0:
            continue
        maps = {key: m for key, (sim, logged) in found.items() if (m := QuantileMap.fit(sim, logged)) is not None}
        physics = {name: _mapped(f, name, maps, name in by_hold) for name, f in physics.items()}
    return FleetFit(tpot_1, maps, hosts.machines, hosts.tiers, hosts.batch_slope), steps


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
                    tally: Tally) -> list[tuple[Logged, Arrival]]:
    """Scenario `name`'s window through its fleet once; TTFTs and sheds into `tally`. Returns each request sent to
    the fleet, as logged and as simulated (what `bench/whatif_validate.py --explain` compares)."""
    return simulate_ensemble(name, config, window, [physics], tally)[0]


def simulate_ensemble(name: str, config: GatewayConfig, window: Window, members: Sequence[Mapping[str, Fitted]],
                      tally: Tally) -> list[list[tuple[Logged, Arrival]]]:
    """Scenario `name`'s window through its fleet once per member of the ensemble (each a physics: `ensemble`):
    every replay's TTFTs into `tally`'s sketches (pooled) and into a tally of its own (`Tally.replays`: the TTFT
    quantiles are the median of theirs), each shed reason's count the mean over the replays (rounded). Returns each
    replay's requests sent to the fleet, as logged and as simulated."""
    assert name != RECORDED
    template: list[tuple[Logged, Arrival]] = []
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
        template.append((rec, Arrival(rec.arrival, rec.tenant, decision.tier, decision.prompt - cached,
                                      decision.completion, rec.stream)))
    replays: list[list[tuple[Logged, Arrival]]] = []
    shed: Counter[str] = Counter()
    for physics in members:
        sent = [(rec, dataclasses.replace(arrival)) for rec, arrival in template]
        Fleet(config.routes, physics).run(arrival for _, arrival in sent)
        each = Tally()
        for _, request in sent:
            if request.shed is not None:
                shed[request.shed] += 1
            elif request.ttft_ms is not None:
                _ttft(each, request.tier, request.tenant, request.ttft_ms)
                _ttft(tally, request.tier, request.tenant, request.ttft_ms)
        tally.replays.append(each)
        replays.append(sent)
    for reason, count in shed.items():
        if (mean := round(count / len(members))) > 0:
            tally.shed[reason] += mean
    return replays


def ensemble(config: GatewayConfig, samples: Mapping[str, Samples], fleet: FleetFit) -> list[dict[str, Fitted]]:
    """The physics of each replay of `config`'s window: `fitted_physics` with each member of `fleet`
    (`FleetFit.members`)."""
    return [fitted_physics(config, samples, member) for member in fleet.members()]


def _ttft(tally: Tally, tier: str, tenant: str, ttft_ms: float) -> None:
    tally.ttft[tier].add(ttft_ms)
    tally.tenant_ttft[tenant].add(ttft_ms)
    tally.overall_ttft.add(ttft_ms)
