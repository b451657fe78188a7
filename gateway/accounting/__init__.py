"""Accounting: settle token counts, price the request, write its log line and metrics."""
