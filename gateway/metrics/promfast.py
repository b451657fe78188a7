"""Lock-free Prometheus counters, gauges and histograms for the event loop (issue 23).

prometheus_client takes a lock (and, for a histogram, walks its buckets) on every observation. These keep
plain Python numbers instead, and turn them into metric families only when /metrics is scraped, through
the same CollectorRegistry: the exposition is prometheus_client's (names, HELP, labels, buckets, _total,
_bucket/_count/_sum and _created samples alike).

What prometheus_client decides, these take from it rather than copy it: the names (a counter declared
`x_total` is exposed as `x_total`, not `x_total_total`), which metric and label names are refused (`__`
prefixes, `le` on a histogram), the label values (str() of each: 1, True and 1.0 are three series), and
whether `_created` series are written (PROMETHEUS_DISABLE_CREATED_SERIES, `disable_created_metrics()`).
A NaN observation goes where prometheus_client puts it: into the sum, in no bucket (and so not in the count).

Not thread-safe, on purpose: `x += v` can lose an update between threads. Every observation (and every
scrape) runs on the event loop's thread: the request stages, admission gates, the limiter, and the shadow
sender, whose coroutines record outcomes and pairs on the loop (its BackgroundEncoder thread only embeds).
A metric observed from another thread belongs in prometheus_client's own classes.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar, cast

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _client
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString
from prometheus_client.validation import _validate_labelnames, _validate_metric_name

# prometheus_client's own rules (untyped upstream, pinned in pyproject.toml): how it writes `le`, names a metric
# (a counter's `_total` cut off: the exposition adds it back), and checks metric and label names
_le_text: Callable[[float], str] = floatToGoString
_full_name: Callable[[str, str, str, str, str], str] = _client._build_full_name
_check_metric_name: Callable[[str], None] = _validate_metric_name
_check_labelnames: Callable[[object, Sequence[str]], tuple[str, ...]] = _validate_labelnames


def created_series() -> bool:
    """Whether `_created` samples are written: prometheus_client's switch, read at each scrape (off with
    PROMETHEUS_DISABLE_CREATED_SERIES=true at import, or prometheus_client.disable_created_metrics())."""
    return bool(_client._use_created)


class CounterChild:
    """One labelled series of a counter."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeChild:
    """One labelled series of a gauge; `set_function` makes it read a callable at scrape time instead."""

    __slots__ = ("value", "function")

    def __init__(self) -> None:
        self.value = 0.0
        self.function: Callable[[], float] | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value

    def set_function(self, function: Callable[[], float]) -> None:
        self.function = function

    def get(self) -> float:
        return float(self.function() if self.function is not None else self.value)


class HistogramChild:
    """One labelled series of a histogram: a count per bucket (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ascending, the last +Inf
        self.counts = [0] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        if amount == amount:  # not NaN: the first bound >= amount (le is inclusive); NaN only in the sum
            self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


Child = TypeVar("Child", CounterChild, GaugeChild, HistogramChild)


class _Family(Collector, Generic[Child]):
    """A metric's series by label values, registered in `registry` as a collector of its own."""

    kind = ""
    _reserved_labelnames: tuple[str, ...] = ()  # read by prometheus_client's check

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name = _full_name(self.kind, name, "", "", "")
        self.documentation = documentation
        self.labelnames = _check_labelnames(self, labelnames)
        _check_metric_name(self.name)
        self._series: dict[tuple[object, ...], Child] = {}  # by label values as exposed (str), in creation order
        self._solo: Child | None = None if self.labelnames else self.labels()
        registry.register(self)

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _add_samples(self, metric: Metric, labels: dict[str, str], child: Child) -> None:
        raise NotImplementedError

    def labels(self, *values: object) -> Child:
        """The series of these label values, created on first use (no values: a metric without labels).
        Each value is exposed as its str(), as prometheus_client does: 1, True and 1.0 are equal as keys
        but three series, so only a tuple of exact strings is looked up as given."""
        key = values
        for value in values:
            if type(value) is not str:
                key = tuple([str(value) for value in values])
                break
        child = self._series.get(key)
        if child is None:
            if len(key) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values!r}")
            child = self._series[key] = self._new_child()
        return child

    def _only(self) -> Child:
        if self._solo is None:
            raise ValueError(f"{self.name} has labels {self.labelnames}: observe it through labels()")
        return self._solo

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, self.kind)

    def collect(self) -> Iterator[Metric]:
        metric = Metric(self.name, self.documentation, self.kind)
        for key, child in self._series.items():
            self._add_samples(metric, dict(zip(self.labelnames, cast("tuple[str, ...]", key))), child)
        yield metric


class Counter(_Family[CounterChild]):
    """A counter, exposed as `<name>_total` and `<name>_created` like prometheus_client's."""

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> CounterChild:
        return CounterChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def _add_samples(self, metric: Metric, labels: dict[str, str], child: CounterChild) -> None:
        metric.add_sample(self.name + "_total", labels, child.value)
        if created_series():
            metric.add_sample(self.name + "_created", labels, child.created)


class Gauge(_Family[GaugeChild]):
    """A gauge."""

    kind = "gauge"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> GaugeChild:
        return GaugeChild()

    def inc(self, amount: float = 1.0) -> None:
        self._only().value += amount

    def dec(self, amount: float = 1.0) -> None:
        self._only().value -= amount

    def set(self, value: float) -> None:
        self._only().value = value

    def set_function(self, function: Callable[[], float]) -> None:
        self._only().function = function

    def _add_samples(self, metric: Metric, labels: dict[str, str], child: GaugeChild) -> None:
        metric.add_sample(self.name, labels, child.get())


class Histogram(_Family[HistogramChild]):
    """A histogram with fixed bucket bounds (+Inf added), exposed as cumulative `_bucket`s, `_count`,
    `_sum` and `_created` like prometheus_client's."""

    kind = "histogram"
    _reserved_labelnames = ("le",)

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds != sorted(bounds) or len(set(bounds)) != len(bounds):  # (prometheus_client allows a repeated
            raise ValueError(f"{name}: buckets not in ascending order")  # bound: a duplicate series Prometheus refuses)
        if bounds and bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2:
            raise ValueError(f"{name}: at least one bucket below +Inf is needed")
        self.bounds = tuple(bounds)
        self._le = tuple(_le_text(bound) for bound in bounds)
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _add_samples(self, metric: Metric, labels: dict[str, str], child: HistogramChild) -> None:
        total = 0
        for le, count in zip(self._le, child.counts):
            total += count
            metric.add_sample(self.name + "_bucket", {**labels, "le": le}, float(total))
        metric.add_sample(self.name + "_count", labels, float(total))
        if self.bounds[0] >= 0:  # as prometheus_client: a sum with negative buckets is no counter
            metric.add_sample(self.name + "_sum", labels, child.sum)
        if created_series():
            metric.add_sample(self.name + "_created", labels, child.created)
