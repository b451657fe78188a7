"""Issue 39: the TTFT model calibrated per replica from the server's /metrics (llama.cpp's prefilled-tokens counter
against the tokens the gateway sent it), and predicted against measured for the same requests."""

from __future__ import annotations

import pytest

from gateway.backends.probe import parse_load
from gateway.backends.stats import ReplicaStats

PAGE = """# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prefilled}
llamacpp:requests_processing 1
llamacpp:requests_deferred 0
"""


def scrape(state: ReplicaStats, prefilled: float) -> None:
    load = parse_load(PAGE.format(prefilled=prefilled), 1.0)
    assert load is not None and load.prompt_tokens == prefilled
    state.observe_load(load)


def test_a_prompt_cache_that_saves_most_tokens_lowers_the_prediction() -> None:
    state = ReplicaStats(prefill_tps=100.0)
    before = state.predict_ttft(100)
    scrape(state, 1000)
    state.sent_tokens += 1000  # the gateway sent 1,000 tokens; the server prefilled 100 of them (cached prefixes)
    scrape(state, 1100)
    assert state.prefill_ratio == pytest.approx(0.1)
    assert state.predict_ttft(100) == pytest.approx(before - 0.9, abs=1e-6)  # 1 s of prefill became 0.1 s


def test_a_template_that_adds_tokens_raises_it_and_small_spans_wait() -> None:
    state = ReplicaStats(prefill_tps=100.0)
    scrape(state, 0)
    state.sent_tokens += 100  # under PREFILL_SENT_MIN: not yet
    scrape(state, 150)
    assert state.prefill_ratio is None
    state.sent_tokens += 200  # the span runs on from the earlier scrape: 300 sent, 450 prefilled
    scrape(state, 450)
    assert state.prefill_ratio == pytest.approx(1.5)


def test_a_restarted_server_starts_over() -> None:
    state = ReplicaStats()
    scrape(state, 5000)
    state.sent_tokens += 500
    scrape(state, 10)  # the counter went back: no sample
    assert state.prefill_ratio is None
    state.sent_tokens += 500
    scrape(state, 260)
    assert state.prefill_ratio == pytest.approx(0.5)


def test_predicted_and_measured_of_the_same_requests() -> None:
    state = ReplicaStats()
    state.observe_ttft(0.2, 100, 0.0, 0.5, predicted_s=0.7)
    state.observe_ttft(0.2, 100, 0.0, 0.5, predicted_s=0.3)
    assert state.ttft_s == pytest.approx(0.2) and state.predicted_ewma_s == pytest.approx(0.5)
