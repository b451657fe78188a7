"""Fault injection: what can go wrong, for which share of requests, decided by a seeded RNG.

All faults are off by default. Every request draws the same number of uniforms whatever
the config, so the same seed and the same request sequence give the same decisions.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Faults to inject; each `*_rate` is the share of requests it applies to."""

    error_rate: float = 0.0  # HTTP 500 with an OpenAI error body, before any byte
    rate_limit_rate: float = 0.0  # HTTP 429 with Retry-After
    retry_after_s: float = 1.0
    stall_s: float = 0.0  # stall before the first token (headers already sent when streaming)
    stall_rate: float = 1.0
    disconnect_after_tokens: int | None = None  # abort the connection after N tokens of the answer (a continued
    # answer counts its prefill: the fault sits at one place in the answer)
    disconnect_rate: float = 1.0
    malformed_sse: bool = False  # emit a garbage SSE event after the first token
    malformed_rate: float = 1.0
    omit_finish_reason: bool = False  # streams end with [DONE] and no chunk carrying a finish_reason
    omit_usage: bool = False  # streams send no usage chunk even when asked (as llama.cpp's server)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name.endswith("_rate") and not 0.0 <= getattr(self, f.name) <= 1.0:
                raise ValueError(f"{f.name} must be in [0, 1], got {getattr(self, f.name)!r}")
        if self.stall_s < 0 or self.retry_after_s < 0:
            raise ValueError("stall_s and retry_after_s must be >= 0")
        if self.disconnect_after_tokens is not None and self.disconnect_after_tokens < 0:
            raise ValueError("disconnect_after_tokens must be >= 0")

    @classmethod
    def from_dict(cls, data: Any) -> FaultConfig:
        """Build from JSON; unknown keys or wrong types raise ValueError."""
        if not isinstance(data, dict):
            raise ValueError("fault config must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"unknown fault field {key!r}")
            ok = _type_ok(key, value)
            if not ok:
                raise ValueError(f"bad value for {key}: {value!r}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


BOOL_FIELDS = frozenset({"malformed_sse", "omit_finish_reason", "omit_usage"})


def _type_ok(key: str, value: object) -> bool:
    if key in BOOL_FIELDS:
        return isinstance(value, bool)
    if key == "disconnect_after_tokens":
        return value is None or (isinstance(value, int) and not isinstance(value, bool))
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(slots=True)
class FaultDecision:
    """The faults one request gets."""

    error: bool = False
    rate_limit: bool = False
    stall_s: float = 0.0
    disconnect_after: int | None = None
    malformed: bool = False
    omit_finish: bool = False
    omit_usage: bool = False


NO_FAULT = FaultDecision()


class FaultInjector:
    """Holds the live FaultConfig and draws per-request decisions from a seeded RNG."""

    def __init__(self, seed: int, config: FaultConfig | None = None) -> None:
        self.config = config or FaultConfig()
        self._rng = random.Random(seed * 7919 + 17)
        self.injected: dict[str, int] = dict.fromkeys(
            ("error", "rate_limit", "stall", "disconnect", "malformed"), 0
        )

    def draw(self) -> FaultDecision:
        """Decide this request's faults (five draws per request, always)."""
        c, r = self.config, self._rng.random
        u = (r(), r(), r(), r(), r())
        d = FaultDecision(
            rate_limit=u[0] < c.rate_limit_rate,
            error=u[1] < c.error_rate,
            stall_s=c.stall_s if c.stall_s > 0 and u[2] < c.stall_rate else 0.0,
            disconnect_after=c.disconnect_after_tokens if u[3] < c.disconnect_rate else None,
            malformed=c.malformed_sse and u[4] < c.malformed_rate,
            omit_finish=c.omit_finish_reason, omit_usage=c.omit_usage,
        )
        if d.rate_limit or d.error:  # rejected before any byte: nothing else applies
            d = FaultDecision(rate_limit=d.rate_limit, error=not d.rate_limit)
        for name, on in (("rate_limit", d.rate_limit), ("error", d.error), ("stall", d.stall_s > 0),
                         ("disconnect", d.disconnect_after is not None), ("malformed", d.malformed)):
            if on:
                self.injected[name] += 1
        return d
