"""Upstream backends: replica bookkeeping and the SSE relay."""
