"""Engine counters and a bounded list of per-request records for reconciliation tests."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["completed", "cancelled", "fault"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one finished request consumed and produced (times on the engine clock)."""

    seq_id: int
    status: Status
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int  # tokens the engine generated
    sent_tokens: int  # tokens written to the client
    finish_reason: str | None
    preemptions: int
    ttft_s: float | None
    e2e_s: float | None


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters; `records` keeps the last `max_records` requests."""

    max_records: int = 10_000
    received: int = 0
    completed: int = 0
    cancelled: int = 0
    failed_fault: int = 0
    rejected: int = 0  # invalid requests (400)
    preemptions: int = 0
    steps: int = 0
    prompt_tokens: int = 0  # of requests admitted to run
    generation_tokens: int = 0
    records: deque[RequestRecord] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.records = deque(maxlen=self.max_records)

    def add(self, rec: RequestRecord) -> None:
        if rec.status == "completed":
            self.completed += 1
        elif rec.status == "cancelled":
            self.cancelled += 1
        else:
            self.failed_fault += 1
        self.records.append(rec)

    def counters(self) -> dict[str, int]:
        return {
            "received": self.received, "completed": self.completed, "cancelled": self.cancelled,
            "failed_fault": self.failed_fault, "rejected": self.rejected,
            "preemptions": self.preemptions, "steps": self.steps,
            "prompt_tokens": self.prompt_tokens, "generation_tokens": self.generation_tokens,
        }

    def record_dicts(self, last: int | None = None) -> list[dict[str, Any]]:
        recs = list(self.records)
        if last is not None:
            recs = recs[-last:] if last > 0 else []
        return [asdict(r) for r in recs]
