"""Circuit breaker, retry budget and the backends' /metrics reader."""

from gateway.backends.breaker import CircuitBreaker
from gateway.backends.probe import parse_load
from gateway.backends.retry_budget import RetryBudget
from gateway.config.routes import Breaker
from gateway.config.routes import RetryBudget as BudgetSettings

SETTINGS = Breaker(failures=3, cooldown_s=0.5, max_cooldown_s=1.5)


def test_the_circuit_opens_after_failures_in_a_row_and_a_success_resets_the_count() -> None:
    breaker = CircuitBreaker()
    for _ in range(2):
        breaker.on_failure(SETTINGS)
    breaker.on_success()
    for _ in range(2):
        breaker.on_failure(SETTINGS)
    assert breaker.state == "closed" and breaker.available()
    breaker.on_failure(SETTINGS)
    assert breaker.state == "open" and not breaker.available()
    assert 0.4 < breaker.retry_in() <= 0.5


def test_after_the_cooldown_one_trial_goes_through_and_its_outcome_decides() -> None:
    breaker = CircuitBreaker()
    for _ in range(3):
        breaker.on_failure(SETTINGS)
    later = breaker.opened_at + 0.6
    assert breaker.available(later)
    breaker.opened_at -= 0.6  # the cooldown has passed
    breaker.on_send()
    assert breaker.state == "half_open" and not breaker.available()  # one trial at a time
    breaker.on_failure(SETTINGS)
    assert breaker.state == "open" and breaker.cooldown_s == 1.0  # doubled
    breaker.opened_at -= 1.1
    breaker.on_send()
    breaker.on_failure(SETTINGS)
    assert breaker.cooldown_s == 1.5  # capped at max_cooldown_s
    breaker.opened_at -= 1.6
    breaker.on_send()
    breaker.on_success()
    assert breaker.state == "closed" and breaker.available()


def test_the_retry_budget_allows_a_share_of_requests_plus_a_floor() -> None:
    settings = BudgetSettings(ratio=0.2, min_per_s=0.1, window_s=10.0)  # floor: 1 retry per window
    budget = RetryBudget()
    for _ in range(50):
        budget.on_request(now=100.0)
    granted = sum(budget.try_retry(settings, now=100.5) for _ in range(30))
    assert granted == 11  # 0.2 * 50 + 0.1 * 10
    assert budget.try_retry(settings, now=115.0)  # the window moved on


def test_the_vllm_gauges_are_read_and_summed_over_engines() -> None:
    page = "\n".join([
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 4.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75',
        "process_cpu_seconds_total 12.0",
    ])
    load = parse_load(page, at=5.0)
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage, load.at) == (5.0, 4.0, 0.75, 5.0)
    assert parse_load("# llama.cpp has no vllm gauges\nfoo 1\n", at=1.0) is None


def test_llama_server_gauges_are_read_as_running_and_waiting() -> None:
    """`llama-server --metrics` (llama.cpp's own names): busy slots run, deferred requests wait."""
    page = "\n".join([
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens",
        "# TYPE llamacpp:prompt_tokens_total counter",
        "llamacpp:prompt_tokens_total 812",
        "# HELP llamacpp:requests_processing Number of requests processing",
        "# TYPE llamacpp:requests_processing gauge",
        "llamacpp:requests_processing 2",
        "# HELP llamacpp:requests_deferred Number of requests deferred",
        "# TYPE llamacpp:requests_deferred gauge",
        "llamacpp:requests_deferred 3",
        "llamacpp:n_busy_slots_per_decode 1.8",
    ])
    load = parse_load(page, at=2.0)
    assert load is not None
    assert (load.running, load.waiting, load.kv_usage, load.at) == (2.0, 3.0, 0.0, 2.0)
