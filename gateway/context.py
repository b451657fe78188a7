"""RequestContext: everything one request carries through the stages, and what they learn.

What the stages learn sits in typed records, each written by one owner (tests/unit/test_record_owners.py):
    reading   what the request asks, read once (gateway.reading.Reading; the parse stage)
    route     the tier, its ranked replicas and why (gateway.routing.decision.RouteDecision; the route's steps)
    upstream  the hop to a replica and what its answer said (gateway.upstream.record.UpstreamRecord)
    result    status, outcome and error as the client saw them (the edge), and the price (the account stage)
              (gateway.accounting.result.RequestResult)
The fields left here are the request as the edge received it, what the parse and policy stages set from it
(body, stream, tenant, max_tokens), and the per-request plumbing (cache status and key, finishers, hooks, trace).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config import GatewayConfig, TenantPolicy
from gateway.accounting.result import RequestResult
from gateway.config.tenants import Assignment
from gateway.routing.decision import RouteDecision
from gateway.reading import CHARS_PER_TOKEN, Reading
from gateway.tokens import prompt_text
from gateway.upstream.record import UpstreamRecord
from gateway.types import CacheStatus, ClientWire, Endpoint, Reply

if TYPE_CHECKING:
    from gateway.routing.decision import Escalation


class Trace(Protocol):
    """What the request path asks of a request's trace (gateway.tracing.otel.RequestTrace)."""

    recording: bool  # sampled: the stages get spans

    def stage(self, span: str | None, stage: Callable[[RequestContext], Awaitable[Reply | None]],
              ctx: RequestContext) -> Awaitable[Reply | None]: ...  # span: the stage's, None for none

    def headers(self) -> dict[str, str]: ...  # traceparent, tracestate, baggage for the backend

    def finish(self, ctx: RequestContext) -> None: ...


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: Endpoint
    config: GatewayConfig  # the config version this request started with, kept to its end
    raw_body: bytes
    api_key: str | None
    started: float  # time.perf_counter() when the request reached the gateway
    ts: float  # wall-clock time of the same moment
    wire: ClientWire | None = None  # the client's protocol when not OpenAI chat/completions (translated at the edge)
    path: str | None = None  # the request's path, as logged (None: refused before aiohttp read it)

    body: dict[str, Any] = field(default_factory=dict)
    reading: Reading | None = None  # what the request asks, read once by parse: stages decide from it
    model_requested: str | None = None
    stream: bool = False
    client_wants_usage: bool = False
    tenant: TenantPolicy | None = None  # set by the policy stage (an experiment arm's policy when in one)
    assignment: Assignment | None = None  # the experiment arm the request is in (policy stage)
    max_tokens: int | None = None
    max_tokens_asked: int | None = None  # what the client asked when the policy clamped it (None: not clamped)

    route: RouteDecision = field(default_factory=RouteDecision)  # tier, replicas and why (gateway.routing)
    prompt_tokens_est: int = 0  # the prompt's length in tokens, guessed from its characters (for routing)
    escalation: Escalation | None = None  # the first part of an escalated answer (gateway.routing.escalate)
    upstream: UpstreamRecord = field(default_factory=UpstreamRecord)  # the hop and its answer (gateway.upstream)

    result: RequestResult = field(default_factory=RequestResult)  # status, outcome, error, price (edge, account)
    keep_text: bool = False  # collect a streamed answer's text (a shadow comparison needs it)
    session_header: str | None = None  # the client's x-session-id (the edge)
    finished_at: float | None = None
    queue_ms: float = 0.0
    cache: CacheStatus = "off"
    cache_key: str | None = None  # set on a miss that may be stored
    finishers: list[Callable[[RequestContext], None]] = field(default_factory=list)  # after accounting
    first_byte_hooks: list[Callable[[float], None]] = field(default_factory=list)  # the upstream answered
    trace: Trace | None = None  # the request's OpenTelemetry trace, when tracing is on
    _prompt_text: str | None = None

    @property
    def tenant_name(self) -> str:
        return self.tenant.name if self.tenant else "anonymous"

    def input_tokens_est(self) -> int:
        """All the input's tokens, estimated (`Reading.input_tokens`: text, tools, media, token ids), at least 1;
        before parse, from the prompt's text."""
        if self.reading is not None:
            return max(1, self.reading.input_tokens)
        return max(1, len(self.prompt_text()) // CHARS_PER_TOKEN)

    def prompt_text(self) -> str:
        """The prompt as plain text (messages' text parts joined), for limits, classifying and affinity.
        Joined once: stages after parse change only sampling fields, never the prompt."""
        if self._prompt_text is None:
            if not self.body:
                return ""  # not parsed yet: nothing to remember
            self._prompt_text = prompt_text(self.endpoint, self.body)
        return self._prompt_text
