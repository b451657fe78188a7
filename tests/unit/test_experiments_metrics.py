"""The shadow outcomes the emulator tests do not reach (tests/integration/test_experiments.py covers stored,
reference_failed and skipped_pressure through /metrics): an answer not to compare, a full queue, a closed
sender and a job that raises are each counted once, in the sender's stats and in gateway_shadow_requests_total
alike, with the job's tenant and tiers."""

from __future__ import annotations

from typing import Any

from gateway.experiments.serving import ShadowTap
from gateway.experiments.shadow import OUTCOMES, AgreementScorer, PairStore, ShadowReply, ShadowSender
from gateway.metrics import GatewayMetrics
from gateway.testing import TEST_TENANT
from tests.unit.test_experiments_shadow import RULE, WordEmbedder, job
from tests.unit.test_experiments_wiring import SHADOW, body, config, routed


def counted(metrics: GatewayMetrics) -> dict[tuple[str, str, str, str], float]:
    """gateway_shadow_requests_total's samples: (tenant, from_tier, to_tier, outcome) -> count."""
    (family,) = [f for f in metrics.registry.collect() if f.name == "gateway_shadow_requests"]
    return {(s.labels["tenant"], s.labels["from_tier"], s.labels["to_tier"], s.labels["outcome"]): s.value
            for s in family.samples if s.name.endswith("_total")}


async def test_each_outcome_is_counted_once_in_stats_and_metrics() -> None:
    metrics = GatewayMetrics()
    calls: list[str] = []

    async def send(tier: str, body: dict[str, Any]) -> ShadowReply:
        calls.append(tier)
        raise RuntimeError("the reference blew up")

    sender = ShadowSender(send, AgreementScorer(WordEmbedder()), PairStore(None), lambda: False, queue_size=1,
                          workers=1, metrics=metrics.shadow)
    accepted = [sender.submit(job(request_id=f"r{i}")) for i in range(3)]  # workers not started: one fits
    assert accepted == [True, False, False]
    sender.start()
    await sender.drain()  # the queued job raises in send
    await sender.aclose()
    assert sender.submit(job()) is False
    assert calls == [RULE.to_tier]

    tap = ShadowTap(ShadowSender(send, sender.scorer, sender.store, lambda: False, metrics=metrics.shadow))
    failed = await routed(config(shadow=SHADOW), body("u"), shadow=tap)
    failed.result.status = 502
    failed.finishers[0](failed)  # an error answer: nothing to compare

    tiers = (RULE.from_tier, RULE.to_tier)
    assert counted(metrics) == {
        ("t", *tiers, "dropped_full"): 2, ("t", *tiers, "failed"): 1, ("t", *tiers, "dropped_closed"): 1,
        (TEST_TENANT, "small", "large", "not_submitted"): 1,
    }
    assert {outcome: sender.stats[outcome] for outcome in OUTCOMES if sender.stats[outcome]} == {
        "dropped_full": 2, "failed": 1, "dropped_closed": 1}
    assert tap.sender.stats["not_submitted"] == 1
    # no pair was logged: no agreement, no cost
    assert metrics.registry.get_sample_value("gateway_shadow_agreement_count", {
        "tenant": "t", "from_tier": RULE.from_tier, "to_tier": RULE.to_tier}) is None
    assert metrics.registry.get_sample_value("gateway_shadow_cost_usd_total", {
        "tenant": "t", "to_tier": RULE.to_tier}) is None
