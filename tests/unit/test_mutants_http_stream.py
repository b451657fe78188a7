"""The edge's stream writer when the request has no transport any more (gateway/http.py `_stream`, issue 42's
request-log-status target): aiohttp says `transport` None for a connection already gone; there is then no write
buffer to ask about, and every chunk is written directly (no timed write)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

import gateway.http as http
from gateway.edge.accounted import new_context
from gateway.testing import gateway_config, tier
from gateway.types import StreamReply


class Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self._chunks = chunks

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk

    def close(self) -> None:
        pass


async def test_a_stream_to_a_request_without_a_transport_writes_each_chunk_directly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    request = make_mocked_request("POST", "/v1/chat/completions")
    monkeypatch.setattr(type(request), "transport", property(lambda self: None))
    timed: list[bytes] = []

    async def write_behind(*args: Any) -> bool:
        timed.append(args[3])
        return True

    monkeypatch.setattr(http, "_write_behind", write_behind)
    ctx = new_context(SimpleNamespace(config=gateway_config([tier("t", ["http://127.0.0.1:9/v1"])])),  # type: ignore[arg-type]
                      "/v1/chat/completions")
    response = await http._stream(request, ctx, StreamReply(Chunks(b"data: a\n\n", b"x" * 100_000)), 1.0)
    assert timed == []  # even the chunk over the high-water mark: there is no buffer to be behind on
    assert response.headers["x-request-id"] == ctx.request_id
    assert response.headers["Content-Type"] == "text/event-stream"
