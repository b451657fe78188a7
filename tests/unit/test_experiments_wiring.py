"""Issue 22 on the request path, stage by stage: the arm replaces the tenant's policy before its limits, the tier
map names the serving tier, the log line, header and trace carry the arm, request owners are recorded for
served requests only, shadow sampling keeps the answer's text and submits only complete answers of the
rule's tier, admission pressure, the shadow send's refusals, and one classifier per gateway."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from gateway import cli, http
from gateway.admission.queue import Waiter
from gateway.backends.pool import ReplicaPool
from gateway.config import ConfigError, GatewayConfig, PolicyConfig
from gateway.context import RequestContext
from gateway.errors import PermissionDenied
from gateway.experiments.feedback import RequestOwner, RequestOwners
from gateway.experiments.promote import promote
from gateway.experiments.serving import SKIPPED_BUSY, GatewaySend, OwnerRecorder, ShadowTap, admission_pressure
from gateway.experiments.shadow import AgreementScorer, PairStore, ShadowSender
from gateway.metrics import GatewayMetrics
from gateway.stages.account import Accountant
from gateway.stages.admission import AdmissionStage
from gateway.routing.affinity import AffinityStage
from gateway.routing.ranking import RankStage
from gateway.stages.policy import PolicyStage
from gateway.stages.proxy import ProxyStage
from gateway.upstream.hop import UpstreamHop
from gateway.testing import TEST_API_KEY, TEST_TENANT, gateway_config, parsed_context, routed as route, tier
from gateway.tokens import TokenCounters
from gateway.tracing.otel import ROOT_KEYS, _request_attributes

TIERS = [tier("small", ["http://127.0.0.1:9/v1"]), tier("large", ["http://127.0.0.1:9/v1"])]
SHORT = {"name": "short", "share": 0.5, "max_tokens": {"default": 7, "maximum": 7}, "default_tier": "large"}
HALF = {"name": "half", "sticky_by": "user",  # the users split the arms (issue 37: by policy only)
        "arms": [{"name": "base", "share": 0.5, "control": True}, SHORT]}


def config(**policy: Any) -> GatewayConfig:
    return gateway_config(TIERS, policy=policy)


def body(user: str, model: str = "auto") -> dict[str, Any]:
    return {"model": model, "user": user, "messages": [{"role": "user", "content": "hi"}]}


async def routed(cfg: GatewayConfig, payload: dict[str, Any], *, shadow: ShadowTap | None = None) -> RequestContext:
    ctx = await parsed_context(cfg, payload)
    await PolicyStage()(ctx)
    await route(ctx, ReplicaPool())
    if shadow is not None:
        await shadow(ctx)
    return ctx


async def test_the_arm_replaces_the_tenant_policy_before_max_tokens_is_set() -> None:
    cfg = config(experiments=[HALF])
    contexts = [await routed(cfg, body(f"user-{i}")) for i in range(40)]
    arms = {ctx.assignment.arm for ctx in contexts if ctx.assignment}
    assert arms == {"base", "short"} and all(ctx.assignment is not None for ctx in contexts)
    for ctx in contexts:
        assert ctx.tenant is not None and ctx.tenant.name == TEST_TENANT and ctx.assignment is not None
        short = ctx.assignment.arm == "short"
        assert (ctx.max_tokens, ctx.body["max_tokens"]) == ((7, 7) if short else (64, 64))
        assert ctx.route.tier is not None and ctx.route.tier.name == ("large" if short else "small")


async def test_the_tier_map_names_the_serving_tier_before_the_allowed_check() -> None:
    cfg = config(tier_map={"large": "small"}, allowed_tiers=["small"])
    assert (await routed(cfg, body("u", "large"))).route.tier.name == "small"  # type: ignore[union-attr]
    explicit = config(tier_map={"small": "large"}, allowed_tiers=["small", "large"])
    assert (await routed(explicit, body("u", "small"))).route.tier.name == "large"  # type: ignore[union-attr]
    auto = config(default_tier="large", tier_map={"large": "small"})
    assert (await routed(auto, body("u"))).route.tier.name == "small"  # type: ignore[union-attr]
    with pytest.raises(PermissionDenied):
        await routed(config(allowed_tiers=["small"]), body("u", "large"))


async def test_the_log_line_header_and_trace_carry_the_arm() -> None:
    cfg = config(experiments=[HALF], ttft_slo_ms=900)
    inside, outside = await routed(cfg, body("user-1")), await routed(config(), body("user-1"))
    accountant = Accountant(TokenCounters(), GatewayMetrics())
    with capture_logs() as logs:
        accountant.settle(inside)
        accountant.settle(outside)
    arm = inside.assignment
    assert arm is not None
    first, second = (entry for entry in logs if entry["event"] == "request")
    assert (first["experiment"], first["arm"], first["arm_control"], first["ttft_slo_ms"]) == (
        "half", arm.arm, arm.control, 900)
    assert (second["experiment"], second["arm"], second["arm_control"], second["ttft_slo_ms"]) == (
        None, None, None, None)
    assert http._headers(inside)["x-gateway-arm"] == f"half/{arm.arm}"
    assert "x-gateway-arm" not in http._headers(outside)
    attributes = dict(zip(ROOT_KEYS, _request_attributes(inside, "chat"), strict=True))
    assert (attributes["gateway.experiment"], attributes["gateway.arm"]) == ("half", arm.arm)
    assert dict(zip(ROOT_KEYS, _request_attributes(outside, "chat"), strict=True))["gateway.arm"] is None


async def test_owners_are_recorded_for_served_requests_only() -> None:
    owners = RequestOwners(None)
    cfg = config(experiments=[HALF])
    served, refused = await routed(cfg, body("user-1")), await routed(cfg, body("user-2"))
    served.result.status, refused.result.status = 200, 429
    record = OwnerRecorder(owners)
    record(served)
    record(refused)
    assert served.assignment is not None
    assert await owners.lookup(served.request_id) == RequestOwner(TEST_TENANT, "half", served.assignment.arm,
                                                                 served.route.tier.name if served.route.tier else None)
    refused.request_id = "other"
    assert await owners.lookup("other") is None


class NoEmbedder:
    async def embed_many(self, texts: Any) -> Any:
        raise AssertionError("not called")


def sender(pressure: bool = False) -> ShadowSender:
    async def send(tier: str, body: dict[str, Any]) -> Any:
        raise AssertionError("not called")

    return ShadowSender(send, AgreementScorer(NoEmbedder()), PairStore(None), lambda: pressure)


SHADOW = {"share": 1.0, "from": "small", "to": "large"}


async def test_a_shadowed_request_keeps_its_text_and_submits_only_a_complete_answer_of_its_tier() -> None:
    tap = ShadowTap(sender())
    cfg = config(shadow=SHADOW)
    other_tier = await routed(cfg, body("u", "large"), shadow=tap)
    assert not other_tier.keep_text and other_tier.finishers == []
    contexts = [await routed(cfg, body("u"), shadow=tap) for _ in range(4)]
    assert all(ctx.keep_text and len(ctx.finishers) == 1 for ctx in contexts)
    complete, failed, brownout, no_text = contexts
    for ctx in contexts:
        ctx.result.status, ctx.upstream.upstream_started, ctx.upstream.response_text = 200, True, "an answer"
    failed.result.status = 502
    brownout.route.tier = cfg.tiers["large"]
    no_text.upstream.response_text = None
    for ctx in contexts:
        ctx.finishers[0](ctx)
    await asyncio.sleep(0)  # the submission runs once the request's finishers are done
    assert tap.sender.pending == 1 and tap.sender.stats["not_submitted"] == 3
    assert (await routed(config(), body("u"), shadow=tap)).finishers == []  # no rule, no sampling
    pressed = ShadowTap(sender(pressure=True))
    assert (await routed(cfg, body("u"), shadow=pressed)).finishers == []
    assert pressed.sender.stats["skipped_pressure"] == 1


async def test_admission_pressure_is_a_queue_or_a_full_gate() -> None:
    pool, metrics = ReplicaPool(), GatewayMetrics()
    admission = AdmissionStage(pool, metrics, RankStage(pool, AffinityStage()))
    pressure = admission_pressure(admission)
    assert not pressure()
    ctx = RequestContext("r", "chat", config(), b"", None, time.perf_counter(), time.time())
    gate = admission.gate(ctx, TIERS[0])
    assert not pressure()
    gate.in_flight = gate.slots
    assert pressure()
    gate.in_flight = 0
    gate.queue.push(Waiter("t", "batch", asyncio.get_running_loop().create_future()))
    assert pressure()


async def test_the_shadow_send_never_waits_for_a_slot_nor_serves_an_unknown_tier() -> None:
    pool, metrics = ReplicaPool(), GatewayMetrics()
    cfg = config()
    pool.configure(cfg.routes)
    admission = AdmissionStage(pool, metrics, RankStage(pool, AffinityStage()))
    proxy = ProxyStage(UpstreamHop(None, pool, None, metrics, lambda ctx: None))  # type: ignore[arg-type]
    send = GatewaySend(lambda: cfg, pool, admission, proxy, lambda ctx: None)
    ctx = RequestContext("r", "chat", cfg, b"", None, time.perf_counter(), time.time())
    gate = admission.gate(ctx, cfg.tiers["large"])
    gate.in_flight = gate.slots
    chat = {"model": "large", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": False}
    reply = await send("large", chat)
    assert reply.status == SKIPPED_BUSY and reply.cost_usd == 0 and gate.in_flight == gate.slots
    assert (await send("nowhere", chat)).status == 404


def classifier_policy(arm_routing: dict[str, Any], own: str | None = "models/difficulty") -> dict[str, Any]:
    key = hashlib.sha256(TEST_API_KEY.encode()).hexdigest()
    routing = None if own is None else {"classifier": own, "bands": [{"tier": "small"}]}
    return {"default_tier": "small", "routing": routing, "tenants": [{"name": TEST_TENANT, "api_key_sha256": key}],
            "experiments": [{"name": "e", "arms": [{"name": "a", "share": 0.5, "routing": arm_routing}]}]}


def test_an_arm_reads_the_policy_classifier_and_may_not_name_another() -> None:
    inherited = gateway_config(TIERS, policy=classifier_policy({"bands": [{"tier": "large"}]}, own="models/mine"))
    tenant = next(iter(inherited.tenants_by_key_hash.values()))
    assert tenant.plan is not None
    assert [a.policy.routing.classifier for a in tenant.plan.experiments[0].arms  # type: ignore[union-attr]
            if a.arm == "a"] == ["models/mine"]
    with pytest.raises(ConfigError) as caught:
        GatewayConfig.build(inherited.routes, PolicyConfig.model_validate(
            classifier_policy({"classifier": "models/other", "bands": [{"tier": "large"}]})))
    [issue] = caught.value.issues
    assert issue.field == "experiments[0].arms[0].routing.classifier" and "one classifier per gateway" in issue.reason


def test_the_classifier_loads_when_only_an_arm_routes_by_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[str] = []

    class Loaded:
        provider = "CPUExecutionProvider"
        cascade = None

    def load(path: Any, **options: Any) -> Loaded:
        loaded.append(str(path))
        return Loaded()

    monkeypatch.setattr("gateway.classifier.difficulty.load_classifier", load)
    arm_only = gateway_config(TIERS, policy=classifier_policy({"bands": [{"tier": "large"}]}, own=None))
    assert cli._scorer(arm_only) is not None and loaded[0].endswith("models/difficulty")
    assert cli._scorer(config()) is None


def test_promoting_bands_keeps_the_classifier_they_read() -> None:
    text = """default_tier: small
routing: {classifier: models/mine, bands: [{tier: small}]}
experiments:
  - name: e
    arms:
      - name: cut
        share: 0.5
        routing: {bands: [{below: 0.3, tier: small}, {tier: large}]}
"""
    promoted = promote(text, "e", "cut").text
    assert "routing: {classifier: models/mine, bands: [{tier: small, below: 0.3}, {tier: large}]}" in promoted
    assert "experiments" not in promoted
