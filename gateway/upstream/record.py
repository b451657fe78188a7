"""`UpstreamRecord`: what the hop to a replica did and what the answer said, one record on the context
(`ctx.upstream`).

Owner: gateway.upstream (the attempt, the hop, settle, the sink, resume, escalation) writes its fields;
`stop_sequence` has one other owner, the protocol edge that reads it off the answer (gateway.protocols.base).
Anyone else goes through a method here, never by assigning a field (tests/unit/test_record_owners.py):
a cache hit (`replayed`), the embeddings stage answering in process (`began`, `finished`), a native Responses
answer (`reported`, `finished`), accounting's token count when the backend gave none (`counted`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.config import Replica
    from gateway.types import UsageSource


@dataclass(slots=True)
class UpstreamRecord:
    replica: Replica | None = None
    attempts: int = 0
    upstream_started: bool = False  # a replica accepted the request (answered 200)
    first_token_at: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int = 0  # prompt tokens the backend served from its prefix cache (when it says)
    completion_tokens: int | None = None
    usage_source: UsageSource | None = None
    stop_sequence: str | None = None  # the stop sequence the backend said ended the answer (protocols.base)
    output_chunks: int = 0  # streamed chunks with content: one token each on llama.cpp and vLLM
    response_text: str | None = None  # the answer's text: non-streamed, or streamed while caching or keep_text
    resumed_parts: list[Any] = field(default_factory=list)  # a resumed stream's parts (gateway.upstream.resume)
    output_capped: bool = False  # the tenant's output cap ended the stream
    held_logprobs: list[float] | None = None  # a held stream's tokens' log-probabilities so far (escalate.hold_tokens)

    def replayed(self, prompt_tokens: int | None, completion_tokens: int | None, finish_reason: str) -> None:
        """A cached answer replayed in place of the hop (gateway.stages.cache): its counts, one chunk, now."""
        self.prompt_tokens, self.completion_tokens, self.usage_source = prompt_tokens, completion_tokens, "cache"
        self.finish_reason = finish_reason
        self.output_chunks = 1
        self.first_token_at = time.perf_counter()

    def began(self) -> None:
        """The work began in process, with no replica (the embeddings stage's own embedder)."""
        self.upstream_started = True

    def finished(self, reason: str, first_token_at: float | None = None) -> None:
        """The answer ended for `reason` (and, when given, came whole at `first_token_at`)."""
        self.finish_reason = reason
        if first_token_at is not None:
            self.first_token_at = first_token_at

    def reported(self, prompt_tokens: int | None, completion_tokens: int | None) -> None:
        """The backend's own usage (a native Responses answer, gateway.protocols.native)."""
        self.prompt_tokens, self.completion_tokens, self.usage_source = prompt_tokens, completion_tokens, "backend"

    def counted(self, prompt_tokens: int, completion_tokens: int | None = None) -> None:
        """Accounting's tokenizer count where the backend reported none (gateway.stages.account): the prompt, and
        the completion when given (None: an abandoned attempt's estimate stays)."""
        self.prompt_tokens = prompt_tokens
        if completion_tokens is not None:
            self.completion_tokens = completion_tokens
        self.usage_source = "counted"
