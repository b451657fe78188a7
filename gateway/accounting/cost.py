"""The price of a request: token prices (with a cached-input rate) or a share of GPU time."""

from __future__ import annotations

from gateway.config.routes import Prices


def cost_usd(prices: Prices, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
    """USD for the tokens actually processed, rounded to a nano-dollar."""
    if prices.gpu_hour is not None:
        gpu = prices.gpu_hour
        seconds = prompt_tokens / gpu.prefill_tokens_per_s + completion_tokens / gpu.decode_tokens_per_s
        return round(seconds * gpu.usd_per_hour / 3600, 9)
    assert prices.input_per_mtok is not None and prices.output_per_mtok is not None
    cached = min(cached_tokens, prompt_tokens)
    cached_rate = prices.input_per_mtok if prices.cached_input_per_mtok is None else prices.cached_input_per_mtok
    total = ((prompt_tokens - cached) * prices.input_per_mtok + cached * cached_rate
             + completion_tokens * prices.output_per_mtok)
    return round(total / 1_000_000, 9)
