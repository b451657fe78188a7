"""gateway.metrics.promfast against prometheus_client, byte for byte: the same declarations and observations, drawn
by hypothesis (odd names, label values of every type, NaN and infinities, refusals), give the same
/metrics bytes, and each call is refused by both or by neither. `_created` is made deterministic by
giving both libraries the same clock."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from types import SimpleNamespace
from typing import Any

import prometheus_client
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import metrics as client_metrics

from gateway.metrics import promfast

NOW = 1_700_000_000.123456
NAMES = ("a", "a_total", "a_created", "b_seconds", "b", "b_bucket", "c_count", "d:e", "f.g", "h é", "")
LABEL_NAMES = ("tier", "status", "le", "quantile", "__reserved", "a-b", "x", "é")
ODD_TEXT = ("", "\n", "\\", '"', "\\n", "é", "\u2028", "\ud800", "1", "1.0", "True", "nan", "a b", "{x=\"y\"}")
label_value = st.one_of(st.sampled_from(ODD_TEXT), st.text(max_size=6), st.integers(-3, 3), st.booleans(),
                        st.floats(), st.sampled_from((1, True, 1.0, 0, False, 0.0, -0.0)))
amount = st.one_of(st.floats(), st.sampled_from((0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 0.005, 60.0)),
                   st.integers(-2, 10))
bounds = st.lists(st.floats(-10, 100, allow_nan=False), max_size=5, unique=True).map(sorted)


@st.composite
def declaration(draw: st.DrawFn) -> tuple[str, str, str, tuple[str, ...], tuple[float, ...]]:
    kind = draw(st.sampled_from(("Counter", "Gauge", "Histogram")))
    labels = tuple(draw(st.lists(st.sampled_from(LABEL_NAMES), max_size=2)))
    buckets = tuple(draw(st.one_of(bounds, st.just([1.0, 0.5]), st.just([math.inf]))))
    return kind, draw(st.sampled_from(NAMES)), draw(st.sampled_from(("Help", "two\nlines \\ \"q\""))), labels, buckets


@st.composite
def operation(draw: st.DrawFn) -> tuple[int, tuple[Any, ...] | None, str, float]:
    """(which declared metric, label values or None for the metric itself, method, amount)."""
    values = draw(st.none() | st.lists(label_value, min_size=1, max_size=3).map(tuple))  # (labels() with none:
    # promfast's way to the one series of a metric without labels, which prometheus_client refuses)
    method = draw(st.sampled_from(("inc", "dec", "set", "observe")))
    return draw(st.integers(0, 3)), values, method, draw(amount)


def run(lib: Any, declarations: list[Any], operations: list[Any]) -> tuple[list[str], bytes | str]:
    """Each call's outcome ('ok' or refused) and the exposition (or the error rendering it)."""
    registry, metrics, outcomes = CollectorRegistry(), [], []
    for kind, name, documentation, labels, buckets in declarations:
        extra = {"buckets": buckets} if kind == "Histogram" else {}
        try:
            metrics.append(getattr(lib, kind)(name, documentation, labels, registry=registry, **extra))
            outcomes.append("ok")
        except ValueError:
            outcomes.append("refused")
    for index, values, method, value in operations:
        if not metrics:
            break
        metric = metrics[index % len(metrics)]
        try:
            target = metric if values is None else metric.labels(*values)
            if not hasattr(target, method):
                outcomes.append("no such method")
                continue
            getattr(target, method)(value)
            outcomes.append("ok")
        except ValueError:
            outcomes.append("refused")
    try:
        return outcomes, generate_latest(registry)
    except UnicodeEncodeError as err:  # a lone surrogate in a label value: neither library can write it
        return outcomes, type(err).__name__


@contextmanager
def same_clock_and_created(created: bool) -> Iterator[None]:
    clock = SimpleNamespace(time=lambda: NOW)
    saved = client_metrics.time, promfast.time, client_metrics._use_created
    client_metrics.time, promfast.time = clock, clock  # type: ignore[assignment]
    (prometheus_client.enable_created_metrics if created else prometheus_client.disable_created_metrics)()
    try:
        yield
    finally:
        client_metrics.time, promfast.time, client_metrics._use_created = saved


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(declaration(), min_size=1, max_size=4), st.lists(operation(), max_size=25), st.booleans())
def test_the_same_calls_give_the_same_bytes_as_prometheus_client(declarations: list[Any], operations: list[Any],
                                                                 created: bool) -> None:
    with same_clock_and_created(created):
        expected = run(prometheus_client, declarations, operations)
        assert run(promfast, declarations, operations) == expected


class Tier(str, Enum):  # a str whose str() is not itself ("Tier.small"), equal and hashed as "small"
    small = "small"


@pytest.mark.parametrize("case", [
    # (declaration, operations): the defects, each a fixed example of the property above
    (("Counter", "t", "H", ("v",), ()), [(0, (1,), "inc", 1.0), (0, (True,), "inc", 2.0), (0, (1.0,), "inc", 4.0)]),
    (("Counter", "x_total", "H", (), ()), [(0, None, "inc", 1.0)]),
    (("Histogram", "h", "H", (), (0.1, 1.0)), [(0, None, "observe", math.nan), (0, None, "observe", 0.5)]),
    (("Counter", "r", "H", ("__name",), ()), []),
    (("Gauge", "g", "H", ("v",), ()), [(0, (0,), "set", 1.0), (0, (False,), "set", 2.0), (0, (-0.0,), "set", 3.0)]),
    (("Counter", "e", "H", ("tier",), ()), [(0, ("small",), "inc", 1.0), (0, (Tier.small,), "inc", 2.0)]),
])
@pytest.mark.parametrize("created", [True, False])
def test_fixed_cases_match(case: tuple[Any, list[Any]], created: bool) -> None:
    declaration_, operations = case
    with same_clock_and_created(created):
        assert run(promfast, [declaration_], operations) == run(prometheus_client, [declaration_], operations)
