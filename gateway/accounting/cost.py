"""The price of a request from its tier's token prices."""

from __future__ import annotations

from gateway.config.routes import Prices


def cost_usd(prices: Prices, prompt_tokens: int, completion_tokens: int) -> float:
    """USD for the tokens actually processed, rounded to a nano-dollar."""
    total = prompt_tokens * prices.input_per_mtok + completion_tokens * prices.output_per_mtok
    return round(total / 1_000_000, 9)
