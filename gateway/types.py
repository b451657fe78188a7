"""Aliases, replies and protocols shared by the stages (no behaviour lives here)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from gateway.errors import GatewayError

Endpoint = Literal["chat", "completions", "embeddings"]
UsageSource = Literal["backend", "counted", "cache"]
CacheStatus = Literal["off", "bypass", "miss", "hit", "semantic_hit"]
Outcome = Literal["ok", "rejected", "upstream_error", "client_disconnected", "internal_error"]

CLIENT_CLOSED_STATUS = 499  # nginx's code for "client closed the request"
AUTO_MODEL = "auto"  # the virtual model: the gateway picks the tier


@dataclass(slots=True)
class JsonReply:
    """A complete response body, sent in one piece."""

    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class ChunkSource(Protocol):
    """Bytes to stream to the client; `close` releases the upstream whatever happened."""

    def chunks(self) -> AsyncIterator[bytes]: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class StreamReply:
    """A server-sent-events response, forwarded chunk by chunk."""

    source: ChunkSource
    headers: Mapping[str, str] = field(default_factory=dict)


Reply = JsonReply | StreamReply


class TokenCounter(Protocol):
    """Counts tokens as one backend does (see gateway.tokens)."""

    def count(self, text: str) -> int: ...

    def count_prompt(self, endpoint: Endpoint, body: dict[str, Any]) -> int: ...


class DifficultyScorer(Protocol):
    """Scores how hard a prompt is for the small tier, in [0, 1]; what it caches of a text is kept in `scope`
    (the tenant's, gateway.keyspace; offline callers leave the default, gateway.classifier.embedder.OFFLINE_SCOPE)."""

    async def score(self, text: str, *, scope: str = ...) -> float: ...


class QualityPredictor(Protocol):
    """Predicts each measured model's expected answer score for a prompt, in [0, 1]
    (gateway.classifier.quality.QualityPredictor; the routes file maps tiers to these models)."""

    models: tuple[str, ...]  # the measured model names it predicts for

    async def predict(self, text: str, *, scope: str = ...) -> dict[str, float]: ...

    def close(self) -> None: ...


class ClientWire(Protocol):
    """What the request path asks of a client protocol translated at the edge (gateway.protocols.base.Wire)."""

    name: str
    key_header: str | None  # a header holding the API key besides Authorization: Bearer

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def error_body(self, err: GatewayError) -> bytes: ...
