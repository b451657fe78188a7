"""Limits toward clients: how long a client may take to send a request or to take a streamed answer.

    header_timeout_s  a connection must deliver complete request headers within this time of being
                      opened (or of its previous response): aiohttp's keep-alive timer, which also
                      runs while headers trickle in, so a slowloris client is dropped
    body_timeout_s    the whole request body must arrive within this time: else 408
    write_timeout_s   a streamed chunk the client's socket cannot take within this time ends the
                      request (status 499, error `client_write_timeout`) and cancels the upstream

The size limits sit elsewhere: headers (aiohttp's parser: 8190-byte lines and fields, 128 headers,
answered 431 in the OpenAI error shape with a request-log line before any handler runs:
`gateway.edge.server`), the body (the policy's `max_body_bytes`, counted decoded and read no further
than that: `gateway.body`), messages (`gateway.stages.parse.MAX_MESSAGES`). Buffering toward a slow reader is
bounded by back-pressure: a write waits for the socket to drain, so the gateway stops reading the
upstream, whose own socket then fills.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Each app's own (`create_app(client_limits=...)`); tests pass shorter ones."""

    header_timeout_s: float = 30.0
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0

    def handler_args(self) -> dict[str, Any]:
        """aiohttp request-handler settings for `web.Application(handler_args=...)` or `web.AppRunner(...)`."""
        # bodies are decoded by gateway.body, which answers a bad or unknown Content-Encoding in the OpenAI shape
        return {"keepalive_timeout": self.header_timeout_s, "auto_decompress": False}
