"""Structured logging, configured once: JSON lines, one per request plus operational events."""

from __future__ import annotations

import logging
import sys
from typing import BinaryIO

import orjson
import structlog


def configure_logging(stream: BinaryIO | None = None, level: int = logging.INFO) -> None:
    """Every logger renders one JSON object per line to `stream` (stdout by default), flushed per line."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        logger_factory=structlog.BytesLoggerFactory(stream or sys.stdout.buffer),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,  # serving only: tests leave logging unconfigured for capture_logs
    )
