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

`overhead` is then replaced by a distribution (`residuals`, `simulate.fit_residuals`): each streamed request's
measured TTFT less the TTFT the simulated fleet gives it when the window is replayed as the log routed it, with no
overhead. What the physics leaves out (the gateway, the network, a loaded machine's scheduling) is drawn from
there, one value per request, in its spread and not only its floor; a tier the log never served draws from all
tiers' residuals.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

import numpy as np

from gateway.config import Tier
from gateway.emulator.profiles import PROFILES, Profile

SAMPLES = 4096  # measurements kept per tier (a reservoir: memory flat in the log's length)
LOW = 5  # percentile of the least loaded requests
MIN_SAMPLES = 5
PREFILL_MIN = 20  # measurements before the prefill speed is fitted (else the routes' or the profile's)
PREFILL_PAIRS = 300  # measurements the prefill fit draws its pairs from


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
class Fitted:
    profile: Profile
    overhead_s: float
    samples: int  # measurements the fit used (0: the profile as it is)
    base: str  # the profile it started from
    residuals: tuple[float, ...] = ()  # seconds: what a request adds to the physics, drawn per request (else overhead)

    def describe(self) -> dict[str, object]:
        p = self.profile
        return {"base_profile": self.base, "samples": self.samples, "tpot_1_ms": round(p.tpot_1_s * 1000, 3),
                "prefill_tps": round(p.prefill_tps, 1), "batch_slope": p.batch_slope,
                "overhead_ms": round(self.overhead_s * 1000, 3), "max_running": p.max_running,
                **({} if not self.residuals else {
                    "residual_ms": {f"p{q}": round(float(np.percentile(self.residuals, q)) * 1000, 3)
                                    for q in (5, 50, 90, 99)},
                    "residuals": len(self.residuals)})}


CPU_BATCH_SLOPE = 1.0  # llama.cpp on CPU threads: k sequences decoded together take about k times one's step


def base_profile(tier: Tier) -> Profile:
    """The emulator profile the tier's replicas run, else the one of its precision (int8 when none matches). A
    llama.cpp replica (`launch: {kind: llama_cpp}`) runs its `parallel` slots at once, on CPU threads that the
    slots share: at most that many sequences, each extra one slowing the step by about a whole step."""
    for replica in tier.replicas:
        launch = getattr(replica, "launch", None)
        if launch is not None and getattr(launch, "kind", None) == "emulator" and launch.profile in PROFILES:
            return PROFILES[launch.profile]
    base = PROFILES.get(str(tier.precision), PROFILES["int8"])
    launch = getattr(tier.replicas[0], "launch", None) if tier.replicas else None
    if launch is not None and getattr(launch, "kind", None) == "llama_cpp":
        slots = int(getattr(launch, "parallel", 1))
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
