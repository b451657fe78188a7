"""Each tier's serving physics, fitted from the log's own measurements, in the emulator's model.

The emulator (`gateway.emulator.physics`) times a replica as prefill (prompt tokens / prefill_tps) plus one
decode step per output token (tpot_1 x (1 + batch_slope x (running - 1)) + KV reads). A tier starts from the
profile its replicas run (`launch: {kind: emulator, profile}` in routes), else the emulator profile of its
precision; then, from the streamed requests the log shows it served (cache misses; a whole answer's `ttft_ms` is its
last token's):

    tpot_1      the 5th percentile of the logged TPOT (the least loaded decode steps), else 1 / decode_tps
    prefill_tps the inverse of TTFT's slope in the uncached prompt tokens (Theil-Sen: the median pairwise slope,
                robust to queued requests) from 20 measurements on; else the tier's `prefill_tokens_per_s`
                where routes give it, else the profile's
    overhead    the 5th percentile of TTFT - prefill - one decode step: what the gateway, the network and
                the server's scheduling add (never below 0)

A tier the log never served keeps its profile and 0 overhead, and is said to be unfitted.

`overhead` is then replaced by maps (`QuantileMap`, fitted by `simulate.fit_fleet`): the window is replayed as
the log routed it, and each request's simulated TTFT from its admission (first token when streamed, last token for
a whole answer) is mapped to the logged one, quantile to quantile (F_logged^-1(F_sim(x)), per tier and per kind:
streamed or whole). What the physics leaves out (the gateway, the network, a loaded machine's scheduling) is the
map's difference from the identity, taken at the request's own rank: a request the simulation finds slow gets the
logged slow requests' time, not an independent draw (which, added to a simulated TTFT, widens its distribution and
moves its median when both are wide and skewed, as llama.cpp's on a shared CPU are). A third map, `busy`, times how
long the gateway's slot is held (the engine's last token onto the logged e2e). A tier the log never served uses
all tiers' maps, pooled.

A CPU-served tier (llama.cpp threads, `cpu_served`) runs on a machine whose speed the log shows varying over the
window: each answer's hold (e2e less its queue wait) against what its engine would take for its tokens beside the
requests the log shows on its replica moves over time, tens of seconds at a time, and on all the machine's replicas
together (other work on the cores, the gateway and the clients on them). `HostSpeed` is that speed, measured from the
log (`simulate.host_speeds`) in two parts: the gateway's own load, which a candidate changes (each other replica of
the machine busy at once adds h to a step's time, and each other sequence on the replica adds the tier's own batch
slope to a decode step: `fit_sharing`), and the external speed at the time, what is left (other tenants' work,
which it does not), measured per tier on its own answers. Each engine step of such a tier takes
`HostSpeed.step(t, others busy)` times the profile's step (at the fitted batch slope), and its gateway slot is held
to its engine's last token (no busy map: the hold's spread is the host's, at the time the log measured it, and the
replicas' concurrency, not a rank).
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple
from urllib.parse import urlsplit

import numpy as np

from gateway.config import Tier
from gateway.emulator.profiles import PROFILES, Profile

SAMPLES = 4096  # measurements kept per tier (a reservoir: memory flat in the log's length)
LOW = 5  # percentile of the least loaded requests
MIN_SAMPLES = 5
PREFILL_MIN = 20  # measurements before the prefill speed is fitted (else the routes' or the profile's)
PREFILL_PAIRS = 300  # measurements the prefill fit draws its pairs from
MAP_KNOTS = 257  # quantiles a QuantileMap keeps at most


@dataclass(slots=True)
class Samples:
    """A reservoir of one tier's measurements: (uncached prompt tokens, TTFT ms, TPOT ms or NaN)."""

    seen: int = 0
    rows: list[tuple[float, float, float]] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(40))

    def add(self, prompt: int, ttft_ms: float, tpot_ms: float | None) -> None:
        row = (float(prompt), ttft_ms, float("nan") if tpot_ms is None else tpot_ms)
        self.seen += 1
        if len(self.rows) < SAMPLES:
            self.rows.append(row)
        elif (slot := self.rng.randrange(self.seen)) < SAMPLES:
            self.rows[slot] = row


@dataclass(frozen=True, slots=True)
class QuantileMap:
    """A monotone map of a simulated time to the logged one (a TTFT, or the time a request held its slot), both in
    seconds from admission: the simulated time's quantile in the fitted window (`sim`) to the logged time at that
    quantile (`logged`), linear between knots; beyond them, the end knot's difference (logged - simulated) is added
    (never below 0)."""

    sim: tuple[float, ...]
    logged: tuple[float, ...]
    samples: int

    @classmethod
    def fit(cls, sim: Sequence[float], logged: Sequence[float]) -> QuantileMap | None:
        """The quantile map of `sim` onto `logged` (both from the same requests); None below MIN_SAMPLES."""
        if min(len(sim), len(logged)) < MIN_SAMPLES:
            return None
        levels = np.linspace(0.0, 1.0, min(MAP_KNOTS, max(len(sim), len(logged))))
        xs, ys = np.quantile(np.asarray(sim), levels), np.quantile(np.asarray(logged), levels)
        knots, group = np.unique(xs, return_inverse=True)  # a simulated TTFT many requests share: their mean
        mean = np.bincount(group, weights=ys) / np.bincount(group)
        return cls(tuple(float(x) for x in knots), tuple(float(y) for y in mean), len(sim))

    def __call__(self, x: float) -> float:
        xs, ys = self.sim, self.logged
        if x <= xs[0]:
            return max(0.0, x + ys[0] - xs[0])
        if x >= xs[-1]:
            return max(0.0, x + ys[-1] - xs[-1])
        i = bisect.bisect_right(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))

    def describe(self) -> dict[str, object]:
        """The knots' added time (logged - simulated, ms) at a few quantiles, and the samples."""
        added = np.array(self.logged) - np.array(self.sim)
        return {"samples": self.samples, "added_ms": {
            f"p{q}": round(float(added[round(q / 100 * (len(added) - 1))]) * 1000, 3) for q in (5, 50, 90, 99)}}


@dataclass(frozen=True, slots=True)
class HostSpeed:
    """A machine's speed over the window, as the log measured it, in two parts. `contention`: the gateway's own load
    on the machine's cores, which a candidate policy changes: each other replica of the machine busy at once adds
    `contention` to a step's time (h: 1 + h x the others busy; `fit_sharing`). The rest is the machine's
    external speed at the time, which a policy does not change (other tenants' work on its cores): the factor on an
    engine step's time from `cuts[i]` to `cuts[i + 1]` (Unix seconds) is `factors[i]`, 1 (the machine's median
    speed) before the first cut and after the last one. Fitted (`fit`) on the answers the log shows on the
    machine's replicas, each as (its replica's start, its end, how much slower than its tier's median answer it ran
    for its tokens, its replica's concurrency and, divided out, the machine's other replicas busy meanwhile): at
    each moment, the geometric mean of the answers in flight (a ratio's average; each in-flight answer measured the
    cores while it ran), 1 where none was. `step` is the factor on a step: both parts."""

    cuts: tuple[float, ...]
    factors: tuple[float, ...]
    samples: int
    contention: float = 0.0

    @classmethod
    def fit(cls, spans: Sequence[tuple[float, float, float]], contention: float = 0.0) -> HostSpeed | None:
        """The speed from (start s, end s, slowdown less the contention's) per answer; None below MIN_SAMPLES
        answers."""
        spans = [(a, b, r) for a, b, r in spans if b > a and r > 0]
        if len(spans) < MIN_SAMPLES:
            return None
        events = sorted([(a, 1, float(np.log(r))) for a, _, r in spans] +
                        [(b, -1, -float(np.log(r))) for _, b, r in spans])
        cuts: list[float] = []
        factors: list[float] = []
        count, total = 0, 0.0
        for i, (at, step, log_ratio) in enumerate(events):
            count += step
            total += log_ratio
            if i + 1 < len(events) and events[i + 1][0] == at:
                continue  # all of one moment's starts and ends first
            factor = float(np.exp(total / count)) if count > 0 else 1.0
            if factors and factors[-1] == factor:
                continue
            cuts.append(at)
            factors.append(factor)
        return cls(tuple(cuts), tuple(factors), len(spans), contention)

    def step(self, t: float, others: float) -> float:
        """The factor on a step's time that starts at `t` with `others` of the machine's other replicas busy."""
        return (1 + self.contention * others) * self(t)

    def __call__(self, t: float) -> float:
        i = bisect.bisect_right(self.cuts, t) - 1
        return self.factors[i] if i >= 0 else 1.0

    def describe(self) -> dict[str, object]:
        """The samples, the contention and the external factor's range over the window (5th, 50th, 95th percentile
        of its time)."""
        if len(self.cuts) < 2:
            return {"samples": self.samples, "contention": self.contention, "factor": list(self.factors)}
        widths = np.diff(np.array(self.cuts))
        order = np.argsort(self.factors[:-1])
        factors, weights = np.array(self.factors[:-1])[order], np.cumsum(widths[order]) / widths.sum()
        return {"samples": self.samples, "contention": self.contention, "factor": {
            f"p{q}": round(float(factors[min(len(factors) - 1, int(np.searchsorted(weights, q / 100)))]), 3)
            for q in (5, 50, 95)}}


CPU_BATCH_SLOPE = 1.0  # llama.cpp on CPU threads: k sequences about k times one's step, unless fitted (`fit_sharing`)
CONTENTION_MAX = 1.0  # two replicas busy on two shared cores: each at most twice as slow as alone (+ h x 1)
CONTENTION_BUCKET_S = 30.0  # the stretch over which the machine's external speed is taken as one
CONTENTION_GRID = 101  # values of h tried, 0 to CONTENTION_MAX
BATCH_SLOPE_MAX = 3.0  # a second sequence on a replica at most 3 more single steps (the logs: 1.95-2.75 on q4)
BATCH_SLOPE_GRID = 61  # values of a tier's batch slope tried, 0 to BATCH_SLOPE_MAX
BATCH_MIN = 20  # answers that shared their replica at least half their run, before a tier's batch slope is fitted
FIT_ROUNDS = 10  # rounds of the contention and the batch slopes fitted in turn, at most


class Answer(NamedTuple):
    """One answer the log shows on a CPU-served replica, as `fit_sharing` reads it."""

    tier: str
    mid: float  # the middle of its run (Unix s): which stretch of the machine's external speed it ran in
    others: float  # the machine's other replicas busy meanwhile (time-average)
    beside: float  # the other answers on its own replica meanwhile (time-average)
    hold: float  # its logged run, s (admission to its end)
    prefill: float  # its engine's prefill, s
    decode: float  # its engine's decode of its output at batch 1, s (tokens x tpot_1)


def fit_sharing(answers: Sequence[Answer]) -> tuple[float, dict[str, float]]:
    """What sharing a machine costs its llama.cpp replicas' steps: h, how much each other busy replica of the machine
    slows a step (0 to CONTENTION_MAX), and each tier's batch slope s, how much each other sequence on the replica
    adds to a decode step (0 to BATCH_SLOPE_MAX; a tier with fewer than BATCH_MIN answers that shared their replica
    for at least half their run keeps CPU_BATCH_SLOPE): the values whose residuals

        log(hold) - log(prefill + decode x (1 + s x beside)) - log(1 + h x others)

    deviate least (mean absolute deviation) from their tier's median in each CONTENTION_BUCKET_S stretch (the
    external speed, which moves over tens of seconds, is taken out within a stretch: what is left is the gateway's
    own concurrency against the answers' speed at about the same time). h and the slopes are fitted in turn (each
    on a grid, the least of equals) until neither moves. Stretches of fewer than 3 answers of a tier say nothing;
    h 0 and no slope when none is left. The batch slope is the tier's own: llama.cpp's CPU kernels reuse a
    quantized model's weights across sequences only from four at once up (a q4 step of two sequences costs at least
    two single ones, docs/BENCHMARKS.md); an f16 replica's second sequence cost less than a whole step in the logs."""
    groups: dict[tuple[str, int], list[Answer]] = {}
    for answer in answers:
        if answer.hold > 0 and answer.prefill + answer.decode > 0:
            groups.setdefault((answer.tier, int(answer.mid // CONTENTION_BUCKET_S)), []).append(answer)
    kept: dict[str, list[np.ndarray]] = {}
    for (tier, _), rows in groups.items():
        if len(rows) >= 3:
            kept.setdefault(tier, []).append(np.array([(float(np.log(a.hold)), a.prefill, a.decode, a.beside,
                                                        a.others) for a in rows]))
    if not kept:
        return 0.0, {}
    fitted = [tier for tier, stretches in kept.items()
              if sum(int((rows[:, 3] >= 0.5).sum()) for rows in stretches) >= BATCH_MIN]
    contentions = np.linspace(0.0, CONTENTION_MAX, CONTENTION_GRID)
    grid = np.linspace(0.0, BATCH_SLOPE_MAX, BATCH_SLOPE_GRID)

    def deviation(tier: str, h: np.ndarray, slope: np.ndarray) -> np.ndarray:
        """The tier's deviation at each (h, slope) pair of the broadcast arrays."""
        total = np.zeros(np.broadcast(h, slope).shape)
        for rows in kept[tier]:
            log_hold, prefill, decode, beside, others = (rows[:, k] for k in range(5))
            y = log_hold - np.log(prefill + decode * (1 + slope[..., None] * beside)) - np.log1p(h[..., None] * others)
            total += np.abs(y - np.median(y, axis=-1, keepdims=True)).sum(axis=-1)
        return total

    slopes = {tier: CPU_BATCH_SLOPE for tier in kept}
    h = 0.0
    for _ in range(FIT_ROUNDS):
        total = sum(deviation(tier, contentions, np.array(slopes[tier])) for tier in kept)
        new_h = float(contentions[int(np.argmin(total))])
        new = {tier: float(grid[int(np.argmin(deviation(tier, np.array(new_h), grid)))]) if tier in fitted
               else slopes[tier] for tier in kept}
        if new_h == h and new == slopes:
            break
        h, slopes = new_h, new
    return h, {tier: slopes[tier] for tier in fitted}


def machine(tier: Tier) -> str:
    """The machine a tier's replicas run on: its first replica's URL host."""
    url = tier.replicas[0].url if tier.replicas else ""
    return urlsplit(url).hostname or url


@dataclass(frozen=True, slots=True)
class Fitted:
    profile: Profile
    overhead_s: float
    samples: int  # measurements the fit used (0: the profile as it is)
    base: str  # the profile it started from
    stream_map: QuantileMap | None = None  # a streamed request's first token (else + overhead_s); the gate's too
    whole_map: QuantileMap | None = None  # a whole answer's last token (else + overhead_s)
    busy_map: QuantileMap | None = None  # how long the gateway's slot is held: admission to the answer's end
    host: HostSpeed | None = None  # a CPU-served tier's machine speed over the window: each step's time factor

    def describe(self) -> dict[str, object]:
        p = self.profile
        return {"base_profile": self.base, "samples": self.samples, "tpot_1_ms": round(p.tpot_1_s * 1000, 3),
                "prefill_tps": round(p.prefill_tps, 1), "batch_slope": p.batch_slope,
                "overhead_ms": round(self.overhead_s * 1000, 3), "max_running": p.max_running,
                **{f"{kind}_map": m.describe() for kind, m in (("stream", self.stream_map),
                                                                ("whole", self.whole_map), ("busy", self.busy_map))
                   if m is not None},
                **({"host_speed": self.host.describe()} if self.host is not None else {})}



def cpu_served(tier: Tier) -> bool:
    """Whether the tier's replicas are llama.cpp servers on CPU threads (`launch: {kind: llama_cpp}`)."""
    launch = getattr(tier.replicas[0], "launch", None) if tier.replicas else None
    return launch is not None and getattr(launch, "kind", None) == "llama_cpp"


def base_profile(tier: Tier) -> Profile:
    """The emulator profile the tier's replicas run, else the one of its precision (int8 when none matches). A
    llama.cpp replica (`launch: {kind: llama_cpp}`) runs its `parallel` slots at once, on CPU threads that the
    slots share: at most that many sequences, each extra one slowing the step by about a whole step."""
    for replica in tier.replicas:
        launch = getattr(replica, "launch", None)
        if launch is not None and getattr(launch, "kind", None) == "emulator" and launch.profile in PROFILES:
            return PROFILES[launch.profile]
    base = PROFILES.get(str(tier.precision), PROFILES["int8"])
    if cpu_served(tier):
        slots = int(getattr(tier.replicas[0].launch, "parallel", 1))
        return dataclasses.replace(base, name=f"llama_cpp ({base.name} physics)", max_running=slots,
                                   batch_slope=CPU_BATCH_SLOPE, kv_read_s_per_token=0.0)
    return base


def _prefill_tps(data: np.ndarray) -> float | None:  
    """Prompt tokens per second from (uncached prompt, TTFT ms) rows: the inverse of TTFT's slope in the prompt
    length, Theil-Sen (the median of the pairwise slopes: robust to the queued and the loaded requests); None
    with too few rows or prompts all alike, or a slope not above 0."""
    if len(data) < PREFILL_MIN:
        return None
    rows = data[np.random.default_rng(40).choice(len(data), PREFILL_PAIRS, replace=False)] \
        if len(data) > PREFILL_PAIRS else data
    dx = rows[:, 0][:, None] - rows[:, 0][None, :]
    dy = rows[:, 1][:, None] - rows[:, 1][None, :]
    wider = dx > 0
    if wider.sum() < PREFILL_MIN:
        return None
    slope = float(np.median(dy[wider] / dx[wider])) / 1000  # seconds per prompt token
    return 1 / slope if slope > 0 else None


def fit(tier: Tier, samples: Samples | None) -> Fitted:
    """The tier's physics: its base profile with tpot_1, prefill speed and overhead from `samples`."""
    base = base_profile(tier)
    prefill_tps = tier.prefill_tokens_per_s or base.prefill_tps
    rows = samples.rows if samples is not None else []
    if len(rows) < MIN_SAMPLES:
        profile = dataclasses.replace(base, prefill_tps=prefill_tps)
        return Fitted(profile, 0.0, 0, base.name)
    data = np.array(rows)
    prefill_tps = _prefill_tps(data) or prefill_tps
    tpots = data[:, 2][~np.isnan(data[:, 2])]
    tpot_1 = float(np.percentile(tpots, LOW)) / 1000 if len(tpots) >= MIN_SAMPLES else base.tpot_1_s
    rest = data[:, 1] / 1000 - data[:, 0] / prefill_tps - tpot_1
    overhead = max(0.0, float(np.percentile(rest, LOW)))
    profile = dataclasses.replace(base, tpot_1_s=tpot_1, prefill_tps=prefill_tps)
    return Fitted(profile, overhead, len(rows), base.name)
