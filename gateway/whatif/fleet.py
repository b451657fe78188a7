"""The window's arrivals replayed in order against a simulated fleet: emulator engines on a model clock.

Each tier of a scenario's routes gets one `gateway.emulator.engine.Engine` per replica, with the physics
fitted from the log (`physics`); the engines run on their model clock (`step` and `emit`, never sleeping).
In front of each tier, the gateway's admission: the adaptive limit (`gateway.admission.gradient.GradientLimit`,
fed each request's TTFT from its admission), at most the tier's batch slots (`slots_per_replica` x replicas),
a FIFO queue of at most `max_queue` whose requests wait at most `max_wait_ms` (503 queue_full, queue_timeout).
A request admitted goes to the replica with the fewest requests in it. Its output length is the logged one
(cut to the scenario's max_tokens); prompt tokens the backend had cached are not prefilled again.
TTFT = queue wait + the engine's time from admission to the first token, through the tier's map to the logged
TTFT (`physics.QuantileMap`: quantile to quantile, fitted on the log's window; else + its fitted overhead); for a
request not streamed, its last token instead, through the tier's map of whole answers (the gateway's `ttft_ms` is
the first byte to the client, and a whole answer arrives at once). The gateway's slot is held from admission to
the answer's end, through the tier's busy map (the logged time at the engine's time's rank; never shorter than
the engine's): on a CPU the replicas share, an answer takes longer than one replica's engine says, and the queue
behind it waits. A CPU-served tier (`physics.cpu_served`) has no busy map: its engine's steps run at the machine's
speed (`physics.HostSpeed.step`): slower by the fitted contention for each other replica of the machine (its URL
host) busy at the step's start in this simulation (the candidate's own load), times the external speed the log
measured at that time; its slot is held to the engine's last token.

The gate's limit is fed each request's first token (for a whole answer too, as the gateway's estimate of it is).
Not modelled, said in the report: prefix affinity and the predicted-TTFT ranking (fewest requests stands for
them), brownout and the priority classes (one FIFO), the TTFT SLO's shorter deadlines, replica failures.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gateway.admission.gradient import GradientLimit
from gateway.config import RoutesConfig
from gateway.config.routes import Admission
from gateway.emulator.engine import Engine
from gateway.emulator.sequence import Sequence, SeqState
from gateway.whatif.physics import Fitted, machine


RELEASE = -1  # an event's replica index when it frees a gateway slot, not a replica's step


@dataclass(slots=True)
class Arrival:
    """One request of the window as a scenario decided it."""

    at: float  # seconds (Unix time)
    tenant: str
    tier: str
    prompt: int  # tokens to prefill (the logged prompt less what the backend had cached)
    output: int  # output tokens (all outputs)
    stream: bool = True  # False: the answer arrives whole, its TTFT is its last token's
    ttft_ms: float | None = None  # the simulated result
    shed: str | None = None
    admitted_at: float = 0.0  # -1 once the admission gate had its sample
    overhead_s: float = 0.0  # what the map added to the first token (`physics.Fitted.stream_map`)
    sim_s: float | None = None  # the engine's time from admission to the TTFT's token, before the map
    done_s: float | None = None  # the engine's time from admission to the last token, before the busy map
    tpot_ms: float | None = None  # the simulated decode time per output token after the first
    waited_s: float = 0.0  # in the admission queue
    deadline: float = 0.0


@dataclass(slots=True)
class _Replica:
    engine: Engine
    active: list[tuple[Sequence, Arrival]] = field(default_factory=list)
    busy: bool = False


@dataclass(slots=True)
class _Tier:
    settings: Admission
    replicas: list[_Replica]
    fitted: Fitted
    capacity: int | None
    limit: GradientLimit
    in_flight: int = 0
    queue: deque[Arrival] = field(default_factory=deque)

    @property
    def slots(self) -> int:
        slots = self.limit.slots
        return self.capacity if self.capacity is not None and self.capacity < slots else slots


class Fleet:
    """A scenario's tiers and replicas (see the module docstring)."""

    def __init__(self, routes: RoutesConfig, physics: Mapping[str, Fitted]) -> None:
        self._tiers: dict[str, _Tier] = {}
        self._events: list[tuple[float, int, int, str]] = []  # (time, order, replica index or RELEASE, tier)
        self._order = 0
        self._next_seq = 0
        self.steps = 0  # engine steps run: the simulation's cost (`simulate.ensemble_size`)
        for tier in routes.tiers:
            fitted = physics.get(tier.name)
            if fitted is None or not tier.replicas:
                continue
            engines = [_Replica(Engine(fitted.profile, seed=i)) for i, _ in enumerate(tier.replicas)]
            capacity = None if tier.slots_per_replica is None else tier.slots_per_replica * len(tier.replicas)
            admission = routes.admission
            self._tiers[tier.name] = _Tier(admission, engines, fitted, capacity, GradientLimit(admission.initial_limit))
        hosts: dict[str, list[_Replica]] = {}
        for tier in routes.tiers:
            if tier.name in self._tiers and self._tiers[tier.name].fitted.host is not None:
                hosts.setdefault(machine(tier), []).extend(self._tiers[tier.name].replicas)
        # each CPU-served replica's machine-mates: the replicas whose busy steps slow its own (`HostSpeed.step`)
        self._mates = {id(r): [o for o in mates if o is not r] for mates in hosts.values() for r in mates}
        self.admission_on = routes.admission.enabled

    def run(self, arrivals: Iterable[Arrival]) -> None:
        """Replay `arrivals` (in time order) to the end of the last answer; each gets its TTFT or its shed."""
        for request in arrivals:
            self._advance(request.at)
            tier = self._tiers.get(request.tier)
            if tier is None:
                request.shed = "no_replica_available"
                continue
            self._arrive(tier, request)
        self._advance(float("inf"))

    def _arrive(self, tier: _Tier, request: Arrival) -> None:
        if not self.admission_on or (not tier.queue and tier.in_flight < tier.slots):
            self._start(tier, request, request.at)
        elif len(tier.queue) >= tier.settings.max_queue:
            request.shed = "queue_full"
        else:
            request.deadline = request.at + tier.settings.max_wait_ms / 1000
            tier.queue.append(request)

    def _start(self, tier: _Tier, request: Arrival, now: float) -> None:
        tier.in_flight += 1
        request.admitted_at, request.waited_s = now, now - request.at
        index, replica = min(enumerate(tier.replicas), key=lambda r: len(r[1].active))
        engine = replica.engine
        if not replica.busy:
            engine.clock = max(engine.clock, now)
        seq = Sequence(self._next_seq, max(1, request.prompt), [], [0] * max(1, request.output),
                       max(1, request.output))
        self._next_seq += 1
        engine.enqueue(seq)
        replica.active.append((seq, request))
        if not replica.busy:
            self._step(request.tier, index, replica)

    def _step(self, name: str, index: int, replica: _Replica) -> None:
        engine = replica.engine
        duration = engine.step()
        self.steps += 1
        host = self._tiers[name].fitted.host
        if host is not None:  # the machine's other replicas busy now, at its external speed of the time
            duration *= host.step(engine.clock, sum(other.busy for other in self._mates[id(replica)]))
        replica.busy = True
        self._order += 1
        heapq.heappush(self._events, (engine.clock + duration, self._order, index, name))

    def _advance(self, until: float) -> None:
        events = self._events
        while events and events[0][0] <= until:
            at, _, index, name = heapq.heappop(events)
            tier = self._tiers[name]
            if index == RELEASE:  # a slot held past the engine's last token
                tier.in_flight -= 1
                self._admit_waiters(tier, at)
                continue
            replica = tier.replicas[index]
            engine = replica.engine
            engine.clock = at
            engine.emit()
            still: list[tuple[Sequence, Arrival]] = []
            freed = 0
            fitted = tier.fitted
            for seq, request in replica.active:
                finished = seq.state is SeqState.FINISHED
                if request.admitted_at >= 0 and seq.first_token_at is not None:  # the gate's sample: first token
                    raw = at - request.admitted_at
                    first = fitted.stream_map(raw) if fitted.stream_map is not None else raw + fitted.overhead_s
                    request.overhead_s = first - raw
                    tier.limit.on_sample(max(0.0, first), tier.in_flight, tier.settings)
                    request.admitted_at = -1.0
                    if request.stream:
                        request.sim_s = raw
                        request.ttft_ms = max(0.0, request.waited_s + first) * 1000
                if request.ttft_ms is None and finished and seq.first_token_at is not None:  # a whole answer
                    raw = at - request.at - request.waited_s
                    whole = fitted.whole_map(raw) if fitted.whole_map is not None else raw + fitted.overhead_s
                    request.sim_s = raw
                    request.ttft_ms = max(0.0, request.waited_s + whole) * 1000
                if finished:
                    request.done_s = done = at - request.at - request.waited_s
                    held = request.at + request.waited_s + fitted.busy_map(done) if fitted.busy_map else at
                    if held > at:
                        self._order += 1
                        heapq.heappush(events, (held, self._order, RELEASE, name))
                    else:
                        freed += 1
                    if request.output > 1 and seq.first_token_at is not None:
                        request.tpot_ms = (at - seq.first_token_at) / (request.output - 1) * 1000
                else:
                    still.append((seq, request))
            replica.active = still
            tier.in_flight -= freed
            self._admit_waiters(tier, at)
            if engine.num_running or engine.num_waiting:
                self._step(name, index, replica)
            else:
                replica.busy = False

    def _admit_waiters(self, tier: _Tier, now: float) -> None:
        queue = tier.queue
        while queue and tier.in_flight < tier.slots:
            request = queue.popleft()
            if request.deadline < now:
                request.shed = "queue_timeout"
                continue
            self._start(tier, request, now)
        while queue and queue[0].deadline < now:  # the waits that ran out before a slot freed
            queue.popleft().shed = "queue_timeout"
