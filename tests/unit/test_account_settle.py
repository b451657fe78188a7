"""Accountant.settle: the request line on disk (written without structlog's chain, byte for byte what structlog
writes), its prices, and structlog's own path kept for capture_logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from typing import Any

import orjson
import pytest
import structlog
from structlog.testing import capture_logs

from gateway.accounting.log import BatchedStream, configure_logging, log_request
from gateway.accounting.records import Record, parse_line
from gateway.config import Tier
from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.stages.account import Accountant
from gateway.testing import gateway_config, tier
from gateway.testing.contexts import request_context
from gateway.tokens import TokenCounters

CONFIG = gateway_config([tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=0.2, output_per_mtok=0.6),
                         tier("big", ["http://127.0.0.1:9/v1"], input_per_mtok=3.0, output_per_mtok=15.0)])
KEYS = [
    "request_id", "ts", "path", "tenant", "model_requested", "difficulty", "quality", "route_reason", "tier", "backend", "status", "outcome", "error",
    "stream", "prompt_tokens", "completion_tokens", "cached_tokens", "usage_source", "priced_from", "ttft_ms", "tpot_ms", "e2e_ms",
    "queue_ms", "predicted_ttft_ms", "brownout_from", "rerouted_from", "spilled_from", "spill", "escalated_from",
    "escalation", "max_tokens",
    "max_tokens_clamped_from",
    "attempts", "prefix_blocks", "output_capped", "finish_reason",
    "cache", "cost_usd", "avoided_cost_usd", "baseline_cost_usd", "saved_usd", "ttft_slo_ms", "resumed", "parts",
    "session", "session_route", "experiment", "arm",
    "arm_control", "replay", "arrival_s", "quality_predicted", "sticky", "turn_keys", "reading",
    "decode_tps",
    "event", "level",
]  # the order the structlog call wrote them in, which readers of the file may rely on
FIELDS: dict[str, Any] = {
    "request_id": "r-1", "ts": "2026-11-25T15:22:26.123+00:00", "tenant": "t", "difficulty": 0.4123, "tier": None,
    "status": 200, "stream": False, "ttft_ms": 12.345, "cost_usd": 0.0000244, "saved_usd": -0.0, "error": "ü \"x\"",
}


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass


@pytest.fixture
def logged() -> Iterator[tuple[Sink, BatchedStream]]:
    """Logging as `gateway serve` configures it, into a Sink; structlog's defaults again afterwards."""
    sink = Sink()
    batched = configure_logging(sink)
    try:
        yield sink, batched
    finally:
        batched.close()
        structlog.reset_defaults()


def served(tier_name: str, prompt: int = 1000, completion: int = 500, cached: int = 0) -> RequestContext:
    ctx = request_context(CONFIG, {"model": tier_name, "messages": [{"role": "user", "content": "hi"}]})
    ctx.tenant = next(iter(CONFIG.tenants_by_key_hash.values()))
    ctx.route.tier = CONFIG.tiers[tier_name]
    ctx.upstream.replica = ctx.route.tier.replicas[0]
    ctx.upstream.upstream_started, ctx.result.status, ctx.upstream.usage_source = True, 200, "backend"
    ctx.upstream.prompt_tokens, ctx.upstream.completion_tokens, ctx.upstream.cached_tokens = prompt, completion, cached
    ctx.upstream.first_token_at = ctx.started + 0.01
    return ctx


def settle(*contexts: RequestContext) -> None:
    accountant = Accountant(TokenCounters(), GatewayMetrics())
    for ctx in contexts:
        accountant.settle(ctx)


def test_the_request_line_is_the_bytes_structlog_writes(logged: tuple[Sink, BatchedStream]) -> None:
    sink, batched = logged
    structlog.get_logger("gateway.requests").info("request", **FIELDS)
    batched.drain()
    through_structlog = bytes(sink.data)
    sink.data.clear()
    log_request(dict(FIELDS))
    batched.drain()
    assert bytes(sink.data) == through_structlog and through_structlog.endswith(b"}\n")
    assert list(orjson.loads(through_structlog)) == [*FIELDS, "event", "level"]


def test_every_request_gets_one_line_in_the_order_and_at_the_prices_finance_reads(
        logged: tuple[Sink, BatchedStream], monkeypatch: pytest.MonkeyPatch) -> None:
    sink, batched = logged
    monkeypatch.setattr(structlog, "get_logger", None)  # the line does not go through structlog
    settle(served("small"), served("big"))
    batched.close()  # shutdown drains what the batch holds
    lines = bytes(sink.data).splitlines()
    assert len(lines) == 2 and all(list(orjson.loads(line)) == KEYS for line in lines)
    small, big = (orjson.loads(line) for line in lines)
    assert (small["cost_usd"], small["baseline_cost_usd"], small["saved_usd"]) == (0.0005, 0.0105, 0.01)
    assert (big["cost_usd"], big["baseline_cost_usd"], big["saved_usd"]) == (0.0105, 0.0105, 0.0)  # the baseline
    assert small["level"] == "info" and small["event"] == "request" and small["ttft_ms"] == 10.0
    record = parse_line(lines[0])
    assert isinstance(record, Record) and record.cost == Decimal("0.0005") and record.tier == "small"


def test_capture_logs_still_sees_the_request_line_once_logging_is_configured(
        logged: tuple[Sink, BatchedStream]) -> None:
    sink, batched = logged
    with capture_logs() as logs:
        settle(served("small"))
    batched.drain()
    assert sink.data == b"" and [entry["event"] for entry in logs] == ["request"]
    assert logs[0]["log_level"] == "info" and logs[0]["cost_usd"] == 0.0005
    settle(served("small"))  # the capture over, lines reach the stream again
    batched.drain()
    assert len(sink.data.splitlines()) == 1


def test_a_level_above_info_drops_the_request_line_as_structlog_does() -> None:
    sink = Sink()
    batched = configure_logging(sink, level=logging.WARNING)
    try:
        structlog.get_logger("gateway.requests").info("request", **FIELDS)
        log_request(dict(FIELDS))
        batched.drain()
        assert sink.data == b""
    finally:
        batched.close()
        structlog.reset_defaults()


def test_after_structlog_is_reset_request_lines_go_through_structlog(logged: tuple[Sink, BatchedStream]) -> None:
    sink, batched = logged
    structlog.reset_defaults()
    with capture_logs() as logs:
        log_request(dict(FIELDS))
    batched.drain()
    assert sink.data == b"" and len(logs) == 1


def test_prices_cached_tokens_and_gpu_time_and_the_price_of_the_day() -> None:
    cached_rate = Tier.model_validate({
        "name": "c", "precision": "int4", "context_window": 4096,
        "replicas": [{"name": "c-0", "url": "http://c/v1", "model": "m"}],
        "prices": [{"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                   {"effective_from": "2026-01-01", "input_per_mtok": 0.2, "output_per_mtok": 0.6,
                    "cached_input_per_mtok": 0.05},
                   {"effective_from": "2026-06-01",
                    "gpu_hour": {"usd_per_hour": 3.6, "prefill_tokens_per_s": 1000, "decode_tokens_per_s": 100}}],
    })
    assert cached_rate.price_at(date(2025, 12, 31)).cost_usd(1000, 500, 400) == 0.002  # no cached price yet
    january = cached_rate.price_at(date(2026, 1, 1))
    assert january.cost_usd(1000, 500, 400) == 0.00044
    assert january.cost_usd(1000, 500, 2000) == 0.00035  # no more cached tokens than prompt tokens
    assert january.cost_usd(1000, 500) == 0.0005
    assert cached_rate.price_at(date(2026, 7, 1)).cost_usd(1000, 500) == 0.006  # 6 GPU-seconds at $3.6/h


def test_without_the_replay_fields_the_line_has_everything_else_and_a_replay_prices_it_again(
        logged: tuple[Sink, BatchedStream]) -> None:
    """`log_replay_fields: false` (a policy that never runs `gateway whatif`): the line drops the replay fields
    and keeps every other field in its order; a replay reads it as a line from before them (price only)."""
    from gateway.whatif.logline import replay_fields
    from gateway.whatif.records import Logged

    sink, batched = logged
    off = gateway_config([tier("small", ["http://127.0.0.1:9/v1"], input_per_mtok=0.2, output_per_mtok=0.6),
                          tier("big", ["http://127.0.0.1:9/v1"], input_per_mtok=3.0, output_per_mtok=15.0)],
                         policy={"log_replay_fields": False})
    ctx = served("small")
    ctx.config = off
    settle(served("small"), ctx)
    batched.close()
    on, without = (orjson.loads(line) for line in bytes(sink.data).splitlines())
    replay = set(replay_fields(served("small")))
    assert list(on) == KEYS and list(without) == [key for key in KEYS if key not in replay]
    assert {k: v for k, v in on.items() if k not in replay | {"request_id", "ts", "e2e_ms"}} == \
        {k: v for k, v in without.items() if k not in {"request_id", "ts", "e2e_ms"}}
    assert Logged(on).replayable and not Logged(without).replayable
