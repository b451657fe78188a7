"""Tenant rate limits and daily budgets: global through Redis, local while Redis is away."""
