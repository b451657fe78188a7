"""A stream held for its first tokens (issue 39, `escalate.hold_tokens`): the scanner that reads each token's
log-probability (and strips them from the client's chunks unless it asked), and the stream sent once the escalate
step decided to keep it: the chunks it held, then the rest of the same relay."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from gateway.routing.escalate import token_logprobs
from gateway.sse import SseScanner
from gateway.types import ChunkSource


class HoldScanner(SseScanner):
    """An `SseScanner` that keeps each token's log-probability in `logprobs` (the list the escalate step reads), and
    sends the client `logprobs: null` when it did not ask for them (`strip`)."""

    def __init__(self, *args: Any, logprobs: list[float], strip: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logprobs = logprobs
        self._strip = strip

    def _tally_chunk(self, chunk: dict[str, Any], raw: bytes) -> bytes | None:
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices:
            seen = False
            for choice in choices:
                if isinstance(choice, dict) and choice.get("logprobs") is not None:
                    self.logprobs.extend(token_logprobs(choice) or ())
                    if self._strip:
                        choice["logprobs"], seen = None, True
            if seen:
                raw = b"data: " + orjson.dumps(chunk)
        return super()._tally_chunk(chunk, raw)


class HeldStream:
    """The client's stream after the hold: the chunks held, then the rest of the relay's (`ChunkSource`)."""

    __slots__ = ("_held", "_rest", "_source")

    def __init__(self, held: Sequence[bytes], rest: AsyncIterator[bytes] | None, source: ChunkSource) -> None:
        self._held = held
        self._rest = rest  # None: the relay's stream ended within the hold
        self._source = source

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self._held:
            yield chunk
        if self._rest is not None:
            async for chunk in self._rest:
                yield chunk

    def close(self) -> None:
        self._source.close()
