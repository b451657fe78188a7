"""RequestContext: everything one request carries through the stages, and what they learn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config import GatewayConfig, Replica, Tenant, Tier
from gateway.types import Endpoint, Outcome, UsageSource


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: Endpoint
    config: GatewayConfig  # the config version this request started with, kept to its end
    raw_body: bytes
    api_key: str | None
    started: float  # time.perf_counter() when the request reached the gateway
    ts: float  # wall-clock time of the same moment

    body: dict[str, Any] = field(default_factory=dict)
    model_requested: str | None = None
    stream: bool = False
    client_wants_usage: bool = False
    tenant: Tenant | None = None
    max_tokens: int | None = None

    difficulty: float | None = None  # the classifier's score, for model 'auto'
    tier: Tier | None = None
    candidates: tuple[Replica, ...] = ()
    replica: Replica | None = None
    attempts: int = 0
    upstream_started: bool = False  # a replica accepted the request (answered 200)

    status: int = 0
    outcome: Outcome = "ok"
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_source: UsageSource | None = None
    output_chunks: int = 0  # streamed chunks with content: one token each on llama.cpp and vLLM
    response_text: str | None = None  # a non-streamed answer the backend gave no usage for
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    queue_ms: float = 0.0

    @property
    def tenant_name(self) -> str:
        return self.tenant.name if self.tenant else "anonymous"

    def prompt_text(self) -> str:
        """The prompt as plain text (messages' text parts joined), for counting and classifying."""
        if self.endpoint == "completions":
            prompt = self.body.get("prompt")
            return prompt if isinstance(prompt, str) else "\n".join(p for p in prompt or () if isinstance(p, str))
        parts: list[str] = []
        for message in self.body.get("messages", ()):
            content = message.get("content")
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "\n".join(parts)
