"""Latency-aware routing gateway for LLM inference (OpenAI-compatible API)."""

__version__ = "0.1.0"
