"""gateway.metrics.promfast: the lock-free series expose exactly what prometheus_client's classes would, from the
same observations (the _created timestamps aside), and refuse what prometheus_client refuses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.metrics import promfast
from gateway.metrics import LATENCY_BUCKETS, GatewayMetrics

BOUNDS = (0.0, 0.1, 0.5, 1.0)


def observe_all(lib: Any, registry: CollectorRegistry) -> None:
    """The same calls on either library's classes."""
    counter = lib.Counter("t_requests", "Requests", ("tier", "status"), registry=registry)
    counter.labels("small", 200).inc()
    counter.labels("small", "200").inc(2.5)
    counter.labels("large", "502").inc(0)
    lib.Counter("t_empty", "No series yet", ("tier",), registry=registry)
    lib.Counter("t_plain", "No labels", registry=registry).inc(3)
    gauge = lib.Gauge("t_depth", "Depth", ("tier", "priority"), registry=registry)
    gauge.labels("small", "high").inc()
    gauge.labels("small", "high").inc(4)
    gauge.labels("small", "high").dec()
    gauge.labels("small", "low").set(7)
    gauge.labels("large", "low").dec(2)
    lib.Gauge("t_in_flight", "In flight", registry=registry).inc()
    lib.Gauge("t_replicas", "Replicas", registry=registry).set_function(lambda: 3)
    histogram = lib.Histogram("t_seconds", "Latency", ("tier",), buckets=LATENCY_BUCKETS, registry=registry)
    for value in (0.0, 0.005, 0.0051, 0.3, 60.0, 61.0, 1e9):  # on a bound, above it, above the last
        histogram.labels("small").observe(value)
    histogram.labels("large")
    plain = lib.Histogram("t_score", "Score", buckets=BOUNDS, registry=registry)
    for value in (-0.5, 0.0, 0.1, 0.7, 2.0):
        plain.observe(value)


def exposition(lib: Any) -> str:
    registry = CollectorRegistry()
    observe_all(lib, registry)
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", generate_latest(registry).decode())


def test_the_exposition_is_prometheus_clients() -> None:
    assert exposition(promfast) == exposition(prometheus_client)


def test_samples_read_through_the_registry() -> None:
    registry = CollectorRegistry()
    observe_all(promfast, registry)
    value = registry.get_sample_value
    assert value("t_requests_total", {"tier": "small", "status": "200"}) == 3.5
    assert value("t_depth", {"tier": "small", "priority": "high"}) == 4
    assert value("t_replicas") == 3
    assert value("t_seconds_bucket", {"tier": "small", "le": "0.005"}) == 2  # le is inclusive
    assert value("t_seconds_bucket", {"tier": "small", "le": "60.0"}) == 5
    assert value("t_seconds_bucket", {"tier": "small", "le": "+Inf"}) == 7
    assert value("t_seconds_count", {"tier": "small"}) == 7
    assert value("t_score_bucket", {"le": "0.0"}) == 2  # below the first bound counts in it
    assert value("t_score_sum") == pytest.approx(2.3)
    assert value("t_seconds_count", {"tier": "large"}) == 0  # labelled, never observed: all zero
    assert (value("t_requests_created", {"tier": "small", "status": "200"}) or 0) > 0


def test_labels_are_cached_and_converted_to_strings() -> None:
    counter = promfast.Counter("t_c", "C", ("status",), registry=CollectorRegistry())
    assert counter.labels(200) is counter.labels("200") is counter.labels(200)


def test_what_prometheus_client_refuses_is_refused() -> None:
    registry = CollectorRegistry()
    counter = promfast.Counter("t_c", "C", ("tier",), registry=registry)
    with pytest.raises(ValueError):
        counter.labels("a").inc(-1)  # a counter only goes up
    with pytest.raises(ValueError):
        counter.labels("a", "b")  # the wrong number of label values
    with pytest.raises(ValueError):
        counter.inc()  # a labelled metric is observed through a series
    with pytest.raises(ValueError):
        promfast.Gauge("t_c", "Again", registry=registry)  # a name taken in the registry
    with pytest.raises(ValueError):
        promfast.Histogram("t_h", "H", buckets=(1.0, 0.5), registry=registry)
    with pytest.raises(ValueError):
        promfast.Histogram("t_h", "H", ("le",), buckets=(1.0,), registry=registry)


def test_the_gateway_metrics_render_every_family_before_any_request() -> None:
    """The Grafana board's names come from TYPE lines: a labelled family with no series yet still has one."""
    text = GatewayMetrics().render().decode()
    for name in ("gateway_requests_total counter", "gateway_ttft_seconds histogram", "gateway_replicas gauge",
                 "gateway_tenant_saved_usd_total counter", "gateway_shadow_agreement histogram"):
        assert f"# TYPE {name}\n" in text


@pytest.mark.parametrize("disabled", ["true", "1", "False", None])
def test_prometheus_disable_created_series_is_read_as_prometheus_client_reads_it(disabled: str | None) -> None:
    """The variable is read by prometheus_client at import: a process of its own for each value."""
    code = ("from prometheus_client import CollectorRegistry, generate_latest\nfrom gateway.metrics import promfast\n"
            "registry = CollectorRegistry()\npromfast.Counter('c_total', 'C', registry=registry).inc()\n"
            "promfast.Histogram('h', 'H', buckets=(1.0,), registry=registry).observe(0.5)\n"
            "print(generate_latest(registry).decode())")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_DISABLE_CREATED_SERIES"}
    if disabled is not None:
        env["PROMETHEUS_DISABLE_CREATED_SERIES"] = disabled
    text = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "c_total 1.0\n" in text and 'h_bucket{le="1.0"} 1.0\n' in text
    assert ("_created" not in text) == (disabled in ("true", "1"))
