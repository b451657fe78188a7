"""Issue 38: the route as declared steps. The pipeline names each step in order; the replicas are ranked once
per request, and exploration survives a second ranking (after a queue wait) and a dry run (`route explain`)."""

from __future__ import annotations

import time
from dataclasses import fields

import pytest

from gateway.backends.pool import ReplicaPool
from gateway.pipeline import RequestPath
from gateway.routing.affinity import AffinityStage
from gateway.routing.detour import DetourStage
from gateway.routing.explain import explain, file_steps
from gateway.routing.ranking import RankStage
from gateway.routing.session import SessionStage
from gateway.routing.sessions import SessionStore
from gateway.routing.tiers import RouteStage
from gateway.stages.policy import PolicyStage
from gateway.testing import TEST_TENANT, TableScorer, gateway_config, parsed_context, tier
from gateway.stages.classify import ClassifyStage

URLS = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
CONFIG = gateway_config([tier("small", URLS), tier("large", ["http://127.0.0.1:11/v1", "http://127.0.0.1:12/v1"])],
                        policy={"routing": {"bands": [{"tier": "small", "below": 0.5}, {"tier": "large"}]},
                                "sessions": {"ttl_s": 600}},
                        balancing={"explore_after_s": 5.0, "near_tie": 0.0})
SMALL, LARGE = CONFIG.tiers["small"], CONFIG.tiers["large"]


def test_the_pipeline_declares_the_routes_steps_in_order() -> None:
    names = [f.name for f in fields(RequestPath)]
    steps = ["classify", "route", "session", "detour", "cache", "affinity", "rank", "admission"]
    assert [n for n in names if n in steps] == steps


def stale(pool: ReplicaPool, tier_name: str = "small") -> None:
    """The tier's second replica passed over for 6 s while the first was picked just now: due for exploration."""
    first, second = CONFIG.tiers[tier_name].replicas
    now = time.monotonic()
    pool.state(first).picked_at, pool.state(second).picked_at = now - 0.1, now - 6.0
    pool.state(second).observe_ttft(4.0, work=20, queue_s=0.0, alpha=0.2)  # one bad sample: ranked last


async def steps_through(pool: ReplicaPool, prompt: str = "hi", sessions: SessionStage | None = None,
                        difficulty: float = 0.1):  # type: ignore[no-untyped-def]
    ctx = await parsed_context(CONFIG, {"model": "auto", "messages": [{"role": "user", "content": prompt}]})
    await PolicyStage()(ctx)
    await ClassifyStage(TableScorer({prompt: difficulty}))(ctx)
    rank = RankStage(pool)
    for step in (RouteStage(), sessions or SessionStage(None), DetourStage(pool), AffinityStage(), rank):
        await step(ctx)
    return ctx, rank


async def test_the_replicas_are_ranked_once_per_request_however_many_steps_move_the_tier(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = ReplicaPool()
    pool.configure(CONFIG.routes)
    sessions = SessionStage(SessionStore(None))
    calls: list[str] = []
    ranking = pool.ranking
    monkeypatch.setattr(pool, "ranking", lambda tier, *a, **k: calls.append(tier.name) or ranking(tier, *a, **k))
    for replica in SMALL.replicas:  # the small tier down: the detour moves 'auto' up
        pool.state(replica).healthy = False
    ctx, _ = await steps_through(pool, sessions=sessions)
    assert ctx.route.tier is LARGE and ctx.route.rerouted_from == "small" and calls == ["large"]


async def test_exploration_survives_the_ranking_made_again_after_a_queue_wait() -> None:
    pool = ReplicaPool()
    pool.configure(CONFIG.routes)
    stale(pool)
    ctx, rank = await steps_through(pool)
    assert ctx.route.tier is SMALL and ctx.route.candidates[0] is SMALL.replicas[1] and ctx.route.explored is SMALL.replicas[1]
    again = await rank.choose(ctx, SMALL)  # what admission does after a wait
    assert again.replicas[0] is SMALL.replicas[1]
    other, _ = await steps_through(pool)  # the next request: explored once per interval
    assert other.route.candidates[0] is SMALL.replicas[0]


async def test_explain_runs_the_steps_dry_and_spends_no_exploration() -> None:
    pool = ReplicaPool()
    pool.configure(CONFIG.routes)
    stale(pool)
    for _ in range(2):
        report = await explain(CONFIG, TEST_TENANT, {"model": "auto", "messages": [{"role": "user", "content": "hi"}]},
                               pool=pool, steps=file_steps(pool), live=True)
        assert report["candidates"][0]["replica"] == SMALL.replicas[1].name
    ctx, _ = await steps_through(pool)
    assert ctx.route.candidates[0] is SMALL.replicas[1]  # still explored by the first real request


async def test_explain_of_a_live_gateway_with_every_replica_down_says_503() -> None:
    pool = ReplicaPool()
    pool.configure(CONFIG.routes)
    for t in CONFIG.routes.tiers:
        for replica in t.replicas:
            pool.state(replica).healthy = False
    body = {"model": "large", "messages": [{"role": "user", "content": "hi"}]}
    live = await explain(CONFIG, TEST_TENANT, body, pool=pool, steps=file_steps(pool), live=True)
    assert live["candidates"] == [] and live["decision"]["status"] == 503
    files = await explain(CONFIG, TEST_TENANT, body)
    assert files["live"] is False and all(c["healthy"] is None for c in files["candidates"])
