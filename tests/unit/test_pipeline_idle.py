"""Idle stages (issue 37): a stage that can tell from the config that it does nothing is left out of the run,
decided once per config version, and brought back by the config that gives it work (a reload, an arm)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.experiments.serving import ShadowTap
from gateway.pipeline import RequestPath
from gateway.routing.affinity import AffinityStage
from gateway.routing.detour import DetourStage
from gateway.routing.session import SessionStage
from gateway.routing.sessions import SessionStore
from gateway.routing.spill import SpillStage
from gateway.stages.classify import ClassifyStage
from gateway.stages.embed import EmbedStage
from gateway.testing import gateway_config, tier
from gateway.types import JsonReply, Reply
from gateway.upstream.escalate import EscalateStage

TIERS = [tier("small", ["http://127.0.0.1:9/v1"]), tier("large", ["http://127.0.0.1:9/v1"])]
BANDS = {"bands": [{"tier": "small", "below": 0.5}, {"tier": "large"}]}


def config(**policy: Any) -> GatewayConfig:
    return gateway_config(TIERS, policy=policy)


def arm_config(**arm: Any) -> GatewayConfig:
    """The tenant sets nothing; half its traffic is an arm with `arm`'s fields."""
    experiment = {"name": "e", "arms": [{"name": "ctl", "share": 0.5, "control": True},
                                        {"name": "new", "share": 0.5, **arm}]}
    return config(experiments=[experiment])


def test_policies_are_the_tenants_the_anonymous_and_every_arm() -> None:
    plain = config(allow_anonymous=True)
    assert {p.name for p in plain.policies()} == {"test-tenant", "anonymous"}
    armed = arm_config(routing=BANDS)
    policies = armed.policies()
    assert len(policies) == 3 and sum(p.routing is not None for p in policies) == 1


def test_each_step_is_idle_exactly_while_no_policy_gives_it_work() -> None:
    pool = ReplicaPool()
    plain = config()
    steps: list[tuple[Any, GatewayConfig]] = [
        (ClassifyStage(None, None), config(routing=BANDS)),
        (ClassifyStage(None, None), arm_config(routing=BANDS)),  # an arm's bands need the difficulty
        (SessionStage(SessionStore(None)), config(sessions={"ttl_s": 600})),
        (SpillStage(pool), config(spill={"ttft_slo_ms": 500})),
        (EscalateStage.__new__(EscalateStage), config(escalate={"min_confidence": 0.5})),
        (ShadowTap(None), config(shadow={"share": 0.1, "from": "small", "to": "large", "judge": "large"})),  # type: ignore[arg-type]
    ]
    for step, busy in steps:
        assert step.idle(plain), type(step).__name__
        assert not step.idle(busy), type(step).__name__
    assert not DetourStage(pool).idle(plain)  # detour is on unless the policy turns it off
    assert DetourStage(pool).idle(config(detour=False))
    assert AffinityStage(None).idle(plain)
    assert EmbedStage(None, lambda ctx: None, None).idle(plain)  # type: ignore[arg-type]
    vectors = tier("vectors", ["http://127.0.0.1:9/v1"]).model_copy(update={"endpoint": "embeddings", "dimensions": 8})
    embedding = gateway_config([*TIERS, vectors])
    assert not EmbedStage(None, lambda ctx: None, None).idle(embedding)  # type: ignore[arg-type]


class Step:
    """A stage that records that it ran; idle under the configs in `idle_under`."""

    def __init__(self, name: str, ran: list[str], idle_under: set[int] | None = None) -> None:
        self.name, self.ran, self.idle_under = name, ran, idle_under

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        self.ran.append(self.name)
        return JsonReply(200, b"{}") if self.name == "proxy" else None


class IdleStep(Step):
    def idle(self, config: GatewayConfig) -> bool:
        return id(config) in (self.idle_under or set())


@pytest.mark.asyncio
async def test_an_idle_stage_is_skipped_until_a_config_gives_it_work() -> None:
    quiet, busy = config(), config(spill={"ttft_slo_ms": 500})
    ran: list[str] = []
    escalated: list[str] = []

    class Escalate:
        def idle(self, cfg: GatewayConfig) -> bool:
            return cfg is quiet

        async def __call__(self, ctx: RequestContext, reply: Reply) -> Reply:
            escalated.append(ctx.request_id)
            return reply

    names = [f.name for f in fields(RequestPath)][:-2]
    stages = {name: (IdleStep(name, ran, {id(quiet)}) if name == "spill" else Step(name, ran)) for name in names}
    path = RequestPath(**stages, escalate=Escalate(), account=None)  # type: ignore[arg-type]
    for cfg, request_id in ((quiet, "a"), (quiet, "b"), (busy, "c"), (quiet, "d")):
        ran.clear()
        await path.run(RequestContext(request_id, "chat", cfg, b"", None, 0.0, 0.0))
        assert ("spill" in ran) == (cfg is busy), (request_id, ran)
        assert ran == [name for name in names if name != "spill" or cfg is busy]
    assert escalated == ["c"]
