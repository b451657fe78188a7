"""The request path: the stages every request runs through, in order, and what runs after the answer.

    parse → policy → classify → route → session → detour → spill → shadow → cache → affinity → rank → admission → embed
    → proxy → escalate,  then  account → finishers

The route is its steps (gateway.routing), each a field here: the candidate tier, the session's tier, the detour
around a tier that is down, then (after the cache: a hit needs no replica) the prefix's replica and the one
ranking of the replicas. Those with a dry run (`RoutingStep`) are what `route explain` runs (`routing_steps`).

`escalate` is the step after the answer: whichever stage replied, the reply passes through it (a low-confidence
answer goes to the next tier up; gateway.upstream.escalate), so it takes the reply and returns the one to send.

A stage returns a reply to stop the request there (a cache hit, an embedding, the proxied answer), None
to go on, or raises a GatewayError to refuse it (the edge renders the error). Whatever happened, the edge
then calls `RequestPath.finish`: accounting prices the request and writes its one log line, then the
finishers the stages left on the context run (limiter booking, cache store, prefix record, admission
permit release, trace end). Finishers run after accounting because some read what it sets (`cost_usd`,
the settled token counts), and each runs in its own guard, so a failure in one never skips another.

A stage that can tell from the config alone that it will do nothing (`Idle`: no policy keeps sessions, spills,
shadows or escalates, no embedding tier, no prefix store) is left out of the untraced run, decided once per config
version: an idle stage costs a request nothing.

When the request is traced, the stages declared `traced(...)` below get a span of their own, named here
(gateway.<name>): a stage is known by its place in this list, whatever its class is called.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Protocol, runtime_checkable

import structlog

from gateway.config import GatewayConfig
from gateway.context import RequestContext, Trace
from gateway.errors import GatewayError
from gateway.experiments.serving import ShadowTap
from gateway.routing.affinity import AffinityStage
from gateway.routing.detour import DetourStage
from gateway.routing.ranking import RankStage
from gateway.routing.session import SessionStage
from gateway.routing.spill import SpillStage
from gateway.routing.tiers import RouteStage
from gateway.stages.account import Accountant
from gateway.stages.admission import AdmissionStage
from gateway.stages.cache import CacheStage
from gateway.stages.classify import ClassifyStage
from gateway.stages.embed import EmbedStage
from gateway.stages.parse import ParseStage
from gateway.stages.policy import PolicyStage
from gateway.stages.proxy import ProxyStage
from gateway.tracing import ADMISSION, CACHE, CLASSIFICATION, UPSTREAM
from gateway.types import Reply
from gateway.upstream.escalate import EscalateStage

log = structlog.get_logger("gateway.pipeline")


class Stage(Protocol):
    """One step of the request path: returns a reply to stop there, None to go on; raises to refuse."""

    async def __call__(self, ctx: RequestContext) -> Reply | None: ...


class RoutingStep(Stage, Protocol):
    """A step of the route: also runs dry, deciding the same from the same state, recording nothing."""

    async def dry(self, ctx: RequestContext) -> None: ...


def traced(span: str) -> dict[str, str]:
    """A stage field's metadata: its stage gets a span of its own, gateway.<span>, when the request is
    traced (the others take microseconds: no span)."""
    return {"span": span}


@dataclass(frozen=True, slots=True)
class RequestPath:
    """The stages in the order they run (the fields' order is the order), and the accountant after them."""

    parse: ParseStage  # the body: JSON, fields, model, stream
    policy: PolicyStage  # the tenant from the API key; its limits, rate limit and budget
    # difficulty, for model 'auto' under a policy with bands
    classify: ClassifyStage = field(metadata=traced(CLASSIFICATION))
    route: RouteStage  # the candidate tier: the model named, or 'auto' by quality floor, band or default
    session: SessionStage  # the conversation's tier when above the routed one (it only moves up)
    detour: DetourStage  # 'auto' on a tier with no healthy replica: the nearest healthy tier
    spill: SpillStage  # 'auto' on a tier predicted to miss the tenant's spill SLO: a tier predicted to meet it
    shadow: ShadowTap  # the tier known: whether this answer is also asked of the shadow tier
    cache: CacheStage = field(metadata=traced(CACHE))  # a stored answer to a repeated deterministic request
    affinity: AffinityStage  # the replica holding the prompt's prefix (a lookup)
    rank: RankStage  # the tier's replicas ranked once: predicted TTFT, exploration, the warm prefix
    # a slot of the tier within the tenant's TTFT objective, or shed
    admission: AdmissionStage = field(metadata=traced(ADMISSION))
    embed: EmbedStage  # /v1/embeddings on a tier served in process
    # the tier's replicas, in order, until one answers; then the relay
    proxy: ProxyStage = field(metadata=traced(UPSTREAM))
    # after the answer, whichever stage gave it: a low-confidence answer asked again of the next tier up
    escalate: EscalateStage
    account: Accountant  # after the answer: tokens, cost, the log line, metrics

    @property
    def stages(self) -> tuple[Stage, ...]:
        stages: tuple[Stage, ...] = _STAGES(self)
        return stages

    def routing_steps(self) -> tuple[RoutingStep, ...]:
        """The route's steps, in order: what `route explain` runs dry."""
        return (self.route, self.session, self.detour, self.spill, self.affinity, self.rank)

    async def run(self, ctx: RequestContext) -> Reply:
        """Run the stages in order until one replies."""
        trace = ctx.trace if ctx.trace is not None and ctx.trace.recording else None
        if trace is not None:
            return await self._run_traced(ctx, trace)
        stages, escalates = self._active(ctx.config)
        for stage in stages:
            reply = await stage(ctx)
            if reply is not None:
                return await self.escalate(ctx, reply) if escalates else reply
        raise GatewayError("no stage produced a reply")

    def _active(self, config: GatewayConfig) -> tuple[tuple[Stage, ...], bool]:
        """The stages that may act under `config` (an idle one does nothing for any request it could serve:
        no policy spills, no embedding tier, ...), and whether a reply may escalate; once per config version."""
        key = (id(self), id(config))
        known = _ACTIVE.get(key)
        if known is not None and known.path is self and known.config is config:
            return known.stages, known.escalates
        stages = tuple(stage for stage in _STAGES(self) if not _idle(stage, config))
        escalates = not _idle(self.escalate, config)
        if len(_ACTIVE) >= MAX_ACTIVE:
            _ACTIVE.pop(next(iter(_ACTIVE)))
        _ACTIVE[key] = _Active(self, config, stages, escalates)
        return stages, escalates

    async def _run_traced(self, ctx: RequestContext, trace: Trace) -> Reply:
        """The same, each stage through the trace, with its span's name (None: no span of its own)."""
        for stage, span in zip(self.stages, SPANS):
            reply = await trace.stage(span, stage, ctx)
            if reply is not None:
                return await self.escalate(ctx, reply)
        raise GatewayError("no stage produced a reply")

    def finish(self, ctx: RequestContext) -> None:
        """After the answer (or the error) went out: accounting, then each finisher, each in its own guard."""
        for step in (self.account.settle, *ctx.finishers):
            try:
                step(ctx)
            except Exception:
                log.exception("finisher_failed", request_id=ctx.request_id, step=getattr(step, "__qualname__", "?"))


@runtime_checkable
class Idle(Protocol):
    """A stage that can tell, from the config alone, that it will do nothing for any request."""

    def idle(self, config: GatewayConfig) -> bool: ...


def _idle(stage: object, config: GatewayConfig) -> bool:
    return isinstance(stage, Idle) and stage.idle(config)


@dataclass(frozen=True, slots=True)
class _Active:
    path: RequestPath
    config: GatewayConfig
    stages: tuple[Stage, ...]
    escalates: bool


MAX_ACTIVE = 16  # (path, config version) pairs remembered: a reload makes one more, tests make a few paths
_ACTIVE: dict[tuple[int, int], _Active] = {}

# (not stages: escalate takes the reply, account runs after it)
_STAGE_FIELDS = tuple(stage for stage in fields(RequestPath) if stage.name not in ("escalate", "account"))
_STAGES = attrgetter(*(stage.name for stage in _STAGE_FIELDS))
SPANS: tuple[str | None, ...] = tuple(stage.metadata.get("span") for stage in _STAGE_FIELDS)  # by stage, in order
