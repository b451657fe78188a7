"""`RouteDecision`: where the request goes and why, one record on the context (`ctx.route`).

Owner: the route's steps (gateway.routing: tiers, session, detour, spill, affinity, ranking) write its fields.
Two fields have one other owner each: the classify stage writes the scores (`difficulty`, `quality`), admission
writes `predicted_ttft_s` and `predicted_on`. Anyone else who moves the request goes through a method here (`brownout`,
`escalate_to`, `pinned`), never by assigning a field: tests/unit/test_record_owners.py checks it.

`Escalation` (the first part of an escalated answer, `ctx.escalation`: gateway.routing.escalate decides,
gateway.upstream.escalate writes it) lives here too, beside the context's other records, so that the context
imports no module that imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config import Replica, Tier
    from gateway.config.policies import Escalate
    from gateway.routing.quality import QualityChoice
    from gateway.routing.spill_decision import SpillChoice


@dataclass(slots=True)
class RouteDecision:
    difficulty: float | None = None  # the classifier's score, for model 'auto' (classify stage)
    quality: Mapping[str, float] | None = None  # the quality predictor's score per measured model (classify stage)
    quality_choice: QualityChoice | None = None  # the tier quality_floor chose, the options and why (route)
    route_reason: str | None = None  # why model 'auto' went to its tier (route)
    tier: Tier | None = None
    candidates: tuple[Replica, ...] = ()
    explored: Replica | None = None  # the replica exploration put first (gateway.routing.ranking)
    prefix_blocks: int = 0  # blocks of the prompt's prefix known to be warm on the chosen replica
    prefix_replica: str | None = None  # the replica holding that prefix
    prefix_tokens: int = 0  # ... and its length in tokens
    predicted_ttft_s: float | None = None  # the chosen replica's predicted TTFT at admission (admission stage)
    predicted_on: Replica | None = None  # the replica predicted_ttft_s is for (admission stage)
    brownout_from: str | None = None  # the saturated tier this request was moved away from (admission, `brownout`)
    rerouted_from: str | None = None  # the tier with no healthy replica 'auto' was moved away from (detour)
    spill: SpillChoice | None = None  # the spill step's decision, when the tenant's policy spills (spill)
    session: str | None = None  # the sticky-tier session the request belongs to (gateway.routing.session)
    session_route: str | None = None  # new, kept, upgraded, or held (the session's tier served, not the routed one)
    session_from: str | None = None  # when held: the tier the turn was routed to

    def brownout(self, saturated: str, target: Tier) -> None:
        """Admission moves the request off a saturated tier (its candidates: the ranking's `Choice.apply`)."""
        self.brownout_from, self.tier = saturated, target

    def escalate_to(self, target: Tier) -> None:
        """Escalation sends the request to the next tier up (its candidates: the ranking's `Choice.apply`)."""
        self.tier = target

    def pinned(self, tier: Tier, candidates: tuple[Replica, ...]) -> None:
        """A request whose tier is given, not routed (an experiment's shadow): the tier and its ranked replicas."""
        self.tier, self.candidates = tier, candidates


@dataclass(frozen=True, slots=True)
class Escalation:
    """An answer that was escalated: the first part (the tier that answered first) and why."""

    rule: Escalate
    confidence: float | None  # None: the answer had no log-probabilities
    from_tier: Tier
    from_replica: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    first_ms: float  # from the request's start to the decision (a held stream: when the client's stream may start)
    # escalated; kept (confident, or no confidence); or why the second tier did not answer: the first answer returned
    outcome: str = "escalated"
