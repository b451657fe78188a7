"""deploy/grafana/gateway.json against a real gateway's /metrics: every query names only metrics the
gateway exposes (with Redis on, after emulator traffic), and the board ships in the Kubernetes manifests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.app import create_app
from gateway.testing import TEST_API_KEY, gateway_config, tier
from tests.conftest import StartApp, StartEmulator

ROOT = Path(__file__).resolve().parents[2]
BOARD = ROOT / "deploy" / "grafana" / "gateway.json"
PROMQL_WORDS = {"sum", "min", "max", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right",
                "rate", "irate", "increase", "histogram_quantile", "and", "or", "unless", "offset"}
SUFFIXES = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def queries() -> list[str]:
    board = json.loads(BOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL query selects: its identifiers, less label matchers, grouping labels,
    ranges, strings, numbers and the language's own words."""
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\"[^\"]*\"",
                      " ", expr)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped))
    return words - PROMQL_WORDS


def exposed(text: str) -> set[str]:
    """Every sample name /metrics can carry, from its TYPE lines (a labelled series with no sample yet included)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        names.update(name + suffix for suffix in SUFFIXES.get(kind, ("",)))
    return names


def test_metric_names_are_read_from_queries() -> None:
    expr = ('sum by (tier, le) (rate(gateway_ttft_seconds_bucket{status="200"}[5m])) / ignoring (tier) group_left '
            "sum(gateway_x)")
    assert metric_names(expr) == {"gateway_ttft_seconds_bucket", "gateway_x"}


METRICS_TOKEN = "metrics-token"  # what Prometheus sends (deploy/k8s/monitoring.yaml), GATEWAY_METRICS_TOKEN


async def test_every_query_names_a_metric_the_gateway_exposes(start_emulator: StartEmulator, start_app: StartApp,
                                                               redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_METRICS_TOKEN", METRICS_TOKEN)
    emulator = await start_emulator()
    url = await start_app(create_app(gateway_config([tier("t", [f"{emulator.url}/v1"])]), redis_url=redis_url))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as session:
        body = {"model": "t", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            await response.read()
        async with session.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}) as response:
            assert "x-gateway-metrics" not in response.headers
            names = exposed(await response.text())
        async with session.get(f"{url}/metrics") as response:  # a tenant's own key is not a metrics key
            assert response.headers["x-gateway-metrics"] == "tenant-series-omitted"
            public = await response.text()
    assert 'tenant="' not in public and "gateway_tenant_cost_usd_total" in names
    assert "gateway_requests_total" in names and "gateway_redis_up" in names
    for expr in queries():
        selected = metric_names(expr)
        assert selected, f"no metric in {expr!r}"
        assert selected <= names, f"{expr!r} names {sorted(selected - names)}, not in /metrics"


def test_the_board_ships_as_a_grafana_sidecar_configmap() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "configmaps.yaml").read_text()))
    (configmap,) = [d for d in docs if d["metadata"]["name"] == "gateway-grafana-dashboard"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["gateway.json"]) == json.loads(BOARD.read_text())
    assert len(queries()) >= 11
