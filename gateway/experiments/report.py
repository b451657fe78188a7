"""`gateway experiments report LOG...`: each experiment's arms side by side, with bootstrap intervals.

Reads the request log (plain or gzip'd, in the order given) and uses three kinds of line:

    request   experiment, arm, arm_control, request_id, status, ttft_ms, tpot_ms, e2e_ms, cost_usd,
              ttft_slo_ms (optional: the tenant's SLO; --slo-ms overrides it)
    feedback  request_id, score, experiment, arm (joined to the request line by request_id when absent)
    shadow    request_id, agreement, judge_score, experiment, arm (joined the same way)

Per arm: request count and share; TTFT, TPOT and E2E p50 and p99 (served requests); goodput (share of all
requests served within the TTFT SLO; served, without an SLO); cost per 1,000 requests; feedback mean
(the last feedback per request id); shadow agreement and judge score means. Each figure has a
percentile-bootstrap 95 % interval (numpy, seeded: the same logs give the same report), and each arm
its difference to the control arm with its own bootstrap interval and a two-sided permutation p-value (the
arm's and the control's values pooled and shuffled between them `n_perm` times: exact under "the arm makes
no difference", whatever the metric's distribution and however few the values).

An experiment makes many comparisons (each metric of each arm against control): at 95 % each, pure noise
would be called `better` or `worse` somewhere most of the time. Verdicts therefore hold the family-wise
error rate at 5 % per experiment with Holm's step-down correction over all its comparisons: `better` or
`worse` when the Holm-adjusted p-value is below 0.05, `inconclusive` otherwise. The intervals shown are
per comparison (unadjusted). A comparison on few values is flagged `small_n` (fewer than 30 values for a
mean, fewer than 5 beyond the quantile for a percentile: 500 for p99) and listed as a warning: its test stays
valid, but it can only find large differences and its interval is rough.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np
import numpy.typing as npt
import orjson

from gateway.accounting.reader import ReadStats, read_lines
from gateway.accounting.records import console_text

Better = Literal["lower", "higher"]
Floats = npt.NDArray[np.float64]
CHUNK = 4_000_000  # resampled indices held at once (int32: 16 MB)
LEVEL = 0.95
ALPHA = 1 - LEVEL  # family-wise, per experiment (Holm)
PERMUTATIONS = 2000  # per comparison: p-values down to 1/2001, below what Holm asks of 40 comparisons
MIN_MEAN_N = 30  # values a mean needs before its comparison is not flagged small
MIN_TAIL = 5  # values beyond a percentile it needs (p99: 500, p50: 10)
CORRECTION = ("permutation p-values, Holm-adjusted over the {m} comparisons of this experiment (metrics x arms): "
              "at most a 5 % chance of any false better/worse; the intervals are per comparison")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    source: str  # the ArmData list it reads
    quantile: float | None  # None: the mean
    better: Better
    unit: str  # "ms" | "%" | "$" | ""
    scale: float = 1.0


METRICS = (
    Metric("ttft_p50", "ttft", 0.5, "lower", "ms"), Metric("ttft_p99", "ttft", 0.99, "lower", "ms"),
    Metric("tpot_p50", "tpot", 0.5, "lower", "ms"), Metric("tpot_p99", "tpot", 0.99, "lower", "ms"),
    Metric("e2e_p50", "e2e", 0.5, "lower", "ms"), Metric("e2e_p99", "e2e", 0.99, "lower", "ms"),
    Metric("goodput", "good", None, "higher", "%", 100.0),
    Metric("cost_per_1k", "cost", None, "lower", "$", 1000.0),
    Metric("feedback", "feedback", None, "higher", ""),
    Metric("agreement", "agreement", None, "higher", ""),
    Metric("judge", "judge", None, "higher", ""),
)  # fmt: skip
METRIC_BY_NAME = {metric.name: metric for metric in METRICS}


@dataclass(slots=True)
class ArmData:
    requests: int = 0
    control_votes: int = 0  # request lines that said arm_control: true
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    good: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    feedback_by_id: dict[str, float] = field(default_factory=dict)
    agreement: list[float] = field(default_factory=list)
    judge: list[float] = field(default_factory=list)
    shadow_cost: float = 0.0

    @property
    def feedback(self) -> list[float]:
        return list(self.feedback_by_id.values())

    def values(self, source: str) -> Floats:
        return np.asarray(getattr(self, source), dtype=np.float64)


@dataclass(slots=True)
class Collected:
    """Per experiment, per arm, what the log lines said."""

    arms: dict[str, dict[str, ArmData]] = field(default_factory=dict)
    stats: ReadStats = field(default_factory=ReadStats)
    malformed: int = 0
    text: int = 0  # console text among the lines (a banner captured with the log): skipped, not malformed
    unmatched_feedback: int = 0  # feedback or shadow lines whose request is not in an experiment in these logs

    def arm(self, experiment: str, arm: str) -> ArmData:
        return self.arms.setdefault(experiment, {}).setdefault(arm, ArmData())


@dataclass(frozen=True, slots=True)
class Row:
    experiment: str
    metric: str
    arm: str
    control: bool
    n: int
    value: float | None
    lo: float | None
    hi: float | None
    diff: float | None = None
    diff_lo: float | None = None
    diff_hi: float | None = None
    verdict: str = ""
    p: float | None = None  # two-sided, this comparison alone
    p_holm: float | None = None  # adjusted over the experiment's comparisons: the verdict reads this
    small_n: bool = False  # too few values (this arm's or the control's) for the figure to be trusted


def collect(paths: Iterable[Path], slo_ms: float | None = None, tenant: str | None = None) -> Collected:
    """Read the logs; feedback and shadow lines are matched to their request's arm after all are read."""
    out = Collected()
    request_arm: dict[str, tuple[str, str]] = {}
    later: list[tuple[str, dict[str, Any]]] = []
    for path in paths:
        for line in read_lines(path, out.stats):
            out.stats.lines += 1
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError:
                if console_text(line):
                    out.text += 1
                else:
                    out.malformed += line.strip() != b""
                continue
            if type(obj) is not dict or (tenant is not None and obj.get("tenant") != tenant):
                continue
            event = obj.get("event")
            if event == "request":
                experiment, arm = obj.get("experiment"), obj.get("arm")
                if type(experiment) is str and type(arm) is str:
                    if _add_request(out.arm(experiment, arm), obj, slo_ms):
                        out.stats.records += 1
                        if type(rid := obj.get("request_id")) is str:
                            request_arm[rid] = (experiment, arm)
                    else:
                        out.malformed += 1
            elif event in ("feedback", "shadow"):
                later.append((event, obj))
    for event, obj in later:
        where = _arm_of(obj, request_arm)
        if where is None:
            out.unmatched_feedback += 1
            continue
        data = out.arm(*where)
        if event == "feedback":
            score, rid = obj.get("score"), obj.get("request_id")
            if _number(score) and type(rid) is str:
                data.feedback_by_id[rid] = float(score)  # the last one per request counts
        else:
            if _number(agreement := obj.get("agreement")):
                data.agreement.append(float(agreement))
            if _number(judge := obj.get("judge_score")):
                data.judge.append(float(judge))
            if _number(cost := obj.get("shadow_cost_usd")):
                data.shadow_cost += float(cost)
    return out


def _arm_of(obj: dict[str, Any], request_arm: dict[str, tuple[str, str]]) -> tuple[str, str] | None:
    experiment, arm = obj.get("experiment"), obj.get("arm")
    if type(experiment) is str and type(arm) is str:
        return experiment, arm
    rid = obj.get("request_id")
    return request_arm.get(rid) if type(rid) is str else None


def _number(value: Any) -> TypeGuard[float]:
    return type(value) in (int, float) and math.isfinite(value)


def _add_request(data: ArmData, obj: dict[str, Any], slo_ms: float | None) -> bool:
    status, cost = obj.get("status"), obj.get("cost_usd", 0.0)
    if type(status) is not int or not _number(cost):
        return False
    ttft, tpot, e2e = obj.get("ttft_ms"), obj.get("tpot_ms"), obj.get("e2e_ms")
    data.requests += 1
    data.control_votes += obj.get("arm_control") is True
    data.cost.append(float(cost))
    served = status == 200
    if served:
        for values, value in ((data.ttft, ttft), (data.tpot, tpot), (data.e2e, e2e)):
            if _number(value):
                values.append(float(value))
    slo = slo_ms if slo_ms is not None else obj.get("ttft_slo_ms")
    good = served and (not _number(slo) or (_number(ttft) and ttft <= slo))
    data.good.append(1.0 if good else 0.0)
    return True


def control_of(arms: dict[str, ArmData], asked: str | None = None) -> str | None:
    """The control arm: asked for, else the one whose lines say arm_control, else one named "control"."""
    if asked is not None:
        return asked if asked in arms else None
    voted = max(arms, key=lambda name: arms[name].control_votes)
    if arms[voted].control_votes:
        return voted
    return "control" if "control" in arms else None


def analyze(collected: Collected, *, control: str | None = None, experiments: Iterable[str] | None = None,
            n_boot: int = 1000, seed: int = 0, n_perm: int = PERMUTATIONS) -> list[Row]:
    rows: list[Row] = []
    names = sorted(collected.arms) if experiments is None else [e for e in experiments if e in collected.arms]
    for experiment in names:
        arms = collected.arms[experiment]
        base = control_of(arms, control)
        order = sorted(arms, key=lambda name: (name != base, name))
        total = sum(data.requests for data in arms.values())
        rows += [Row(experiment, "requests", arm, arm == base, arms[arm].requests,
                     arms[arm].requests / total if total else None, None, None) for arm in order]
        measured: list[Row] = []
        for metric in METRICS:
            if not any(len(getattr(data, metric.source)) for data in arms.values()):
                continue
            reps = {arm: _replicates(arms[arm].values(metric.source), metric, n_boot, seed, experiment, arm)
                    for arm in order}
            for arm in order:
                measured.append(_row(experiment, metric, arm, base, arms, reps, n_perm, seed))
        rows += holm(measured)
    return rows


def comparisons(rows: Iterable[Row], experiment: str) -> int:
    """How many comparisons the experiment's verdicts were corrected for."""
    return sum(1 for row in rows if row.experiment == experiment and row.p is not None)


def holm(rows: list[Row]) -> list[Row]:
    """Verdicts from Holm's step-down adjustment of the rows' p-values (one experiment's family)."""
    tested = sorted((row.p, i) for i, row in enumerate(rows) if row.p is not None)
    adjusted: dict[int, float] = {}
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    out = []
    for i, row in enumerate(rows):
        if i not in adjusted:
            out.append(row)
            continue
        verdict = "inconclusive"
        if adjusted[i] < ALPHA and row.diff is not None and row.diff != 0:
            higher = row.diff > 0
            verdict = "better" if higher == (METRIC_BY_NAME[row.metric].better == "higher") else "worse"
        out.append(replace(row, p_holm=adjusted[i], verdict=verdict))
    return out


def _row(experiment: str, metric: Metric, arm: str, base: str | None, arms: dict[str, ArmData],
         reps: dict[str, Floats | None], n_perm: int, seed: int) -> Row:
    values = arms[arm].values(metric.source)
    value = _stat(values, metric)
    mine = reps[arm]
    lo, hi = _interval(mine)
    if base is None or arm == base:
        return Row(experiment, metric.name, arm, arm == base, len(values), value, lo, hi,
                   verdict="control" if arm == base else "")
    control_values = arms[base].values(metric.source)
    control_value = _stat(control_values, metric)
    theirs = reps[base]
    small = _small(len(values), metric) or _small(len(control_values), metric)
    if value is None or control_value is None or mine is None or theirs is None:
        return Row(experiment, metric.name, arm, False, len(values), value, lo, hi, verdict="n/a", small_n=small)
    diff = value - control_value
    diff_lo, diff_hi = _interval(mine - theirs)
    rng = np.random.default_rng([seed, 1, *(zlib.crc32(s.encode()) for s in (experiment, metric.name, arm))])
    return Row(experiment, metric.name, arm, False, len(values), value, lo, hi, diff, diff_lo, diff_hi,
               p=permutation_p(values, control_values, metric, n_perm, rng), small_n=small)


def _small(n: int, metric: Metric) -> bool:
    if metric.quantile is None:
        return n < MIN_MEAN_N
    return n * min(metric.quantile, 1 - metric.quantile) < MIN_TAIL


def permutation_p(mine: Floats, theirs: Floats, metric: Metric, n_perm: int, rng: np.random.Generator) -> float:
    """Two-sided: the share of `n_perm` relabellings of the pooled values whose difference of the statistic is at
    least the observed one (ties count against the arm), with the +1 that keeps it valid."""
    def stats(values: Floats) -> Floats:
        if metric.quantile is None:
            return np.asarray(values.mean(axis=-1), dtype=np.float64)
        return np.asarray(np.quantile(values, metric.quantile, axis=-1), dtype=np.float64)

    pooled, cut = np.concatenate([mine, theirs]), len(mine)
    observed = abs(float(stats(mine) - stats(theirs)))
    at_least = observed * (1 - 1e-9)  # float noise in a tie must not make it look extreme
    rows, count = max(1, CHUNK // len(pooled)), 0
    for start in range(0, n_perm, rows):
        shuffled = rng.permuted(np.broadcast_to(pooled, (min(rows, n_perm - start), len(pooled))), axis=1)
        count += int(np.count_nonzero(np.abs(stats(shuffled[:, :cut]) - stats(shuffled[:, cut:])) >= at_least))
    return (count + 1) / (n_perm + 1)


def _stat(values: Floats, metric: Metric) -> float | None:
    if not len(values):
        return None
    stat = np.quantile(values, metric.quantile) if metric.quantile is not None else values.mean()
    return float(stat) * metric.scale


def _interval(replicates: Floats | None) -> tuple[float | None, float | None]:
    if replicates is None:
        return None, None
    lo, hi = np.percentile(replicates, [100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2])
    return float(lo), float(hi)


def _replicates(values: Floats, metric: Metric, n_boot: int, seed: int, experiment: str, arm: str) -> Floats | None:
    """The statistic on `n_boot` resamples with replacement (None with fewer than 2 values)."""
    n = len(values)
    if n < 2 or n_boot < 1:
        return None
    rng = np.random.default_rng([seed, *(zlib.crc32(s.encode()) for s in (experiment, metric.name, arm))])
    out = np.empty(n_boot)
    rows = max(1, CHUNK // n)
    ordered = np.sort(values)
    if metric.quantile is not None:
        h = (n - 1) * metric.quantile  # numpy's default (linear) quantile, on each resample
        below = math.floor(h)
        above, frac = min(below + 1, n - 1), h - below
    for start in range(0, n_boot, rows):
        count = min(rows, n_boot - start)
        picks = rng.integers(0, n, size=(count, n), dtype=np.int32)
        if metric.quantile is None:
            out[start:start + count] = ordered[picks].mean(axis=1)
            continue
        # the k-th smallest of a resample is `ordered` at the k-th smallest index picked: partition the
        # indices, never the values
        picks.partition(sorted({below, above}), axis=1)
        low, high = ordered[picks[:, below]], ordered[picks[:, above]]
        out[start:start + count] = low + (high - low) * frac
    return out * metric.scale
