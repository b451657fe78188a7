"""The experiments package on the request path: what the stages call, and the gateway's own shadow `send`.

    owners = OwnerRecorder(RequestOwners(guard))      # PolicyStage(..., record_owner=owners): feedback's tenant check
    tap = ShadowTap(ShadowSender(GatewaySend(...), AgreementScorer(BackgroundEncoder()), PairStore(...),
                                 admission_pressure(admission)))
    RouteStage(pool, shadow=tap)                      # once the tier is known: sample, keep the answer's text

A shadowed request is decided at routing (so a streamed answer's text is collected) and submitted by a
finisher once its answer is complete and came from the rule's `from` tier (a brownout to another tier, an
error, a cache hit or a hang-up submits nothing). The reference (and judge) calls go through the gateway's own
upstream code (`ProxyStage`: ranked replicas, failover, leases, the replica statistics) at batch priority:
never queued (a tier without a free admission slot skips the call), outside every tenant's rate limit and
budget, priced at the tier's prices and logged only as the `shadow` line's cost.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gateway.backends.pool import ReplicaPool
from gateway.clock import utc_day
from gateway.config import GatewayConfig
from gateway.context import RequestContext
from gateway.reading import read
from gateway.errors import GatewayError
from gateway.experiments.feedback import RequestOwner, RequestOwners
from gateway.experiments.shadow import Embedder, Embedding, ShadowJob, ShadowReply, ShadowSender
from gateway.stages.admission import AdmissionStage
from gateway.stages.proxy import ProxyStage
from gateway.types import Reply

if TYPE_CHECKING:  # onnxruntime is imported only when a shadow pair is first scored
    from gateway.classifier.encoder import EncoderSession

_SHADOW_IDS = itertools.count(1)
SKIPPED_BUSY = 503  # a ShadowReply's status when the reference tier had no free admission slot


MAX_KNOWN_OWNERS = 4096  # distinct (tenant, experiment, arm, tier) an OwnerRecorder keeps made


class OwnerRecorder:
    """A finisher: remembers who a served request belonged to, for POST /v1/feedback."""

    __slots__ = ("owners", "_known")

    def __init__(self, owners: RequestOwners) -> None:
        self.owners = owners
        self._known: dict[tuple[str, str | None, str | None, str | None], RequestOwner] = {}

    def __call__(self, ctx: RequestContext) -> None:
        if ctx.result.status != 200 or ctx.tenant is None:
            return
        arm = ctx.assignment
        key = (ctx.tenant.name, arm.experiment if arm else None, arm.arm if arm else None,
               ctx.route.tier.name if ctx.route.tier else None)
        owner = self._known.get(key)
        if owner is None:  # a few per config (tenants x arms x tiers): each made once
            if len(self._known) >= MAX_KNOWN_OWNERS:
                self._known.clear()
            owner = self._known[key] = RequestOwner(*key)
        self.owners.record(ctx.request_id, owner)


class ShadowTap:
    """At routing: whether this request is shadowed (its tenant's rule, its tier, the share, no admission
    pressure); if so its answer's text is kept and a finisher submits the comparison."""

    __slots__ = ("sender",)

    def __init__(self, sender: ShadowSender) -> None:
        self.sender = sender

    def idle(self, config: GatewayConfig) -> bool:
        """No policy under `config` shadows: the tap does nothing."""
        return not any(p.shadow is not None for p in config.policies())

    async def __call__(self, ctx: RequestContext) -> Reply | None:
        tenant, tier = ctx.tenant, ctx.route.tier
        if tenant is None or tenant.shadow is None or tier is None or tier.endpoint != "chat":
            return None
        rule = self.sender.sample(tenant, tier.name)
        if rule is None:
            return None
        ctx.keep_text = True
        ctx.finishers.append(self._submit)
        return None

    def _submit(self, ctx: RequestContext) -> None:
        tenant, tier = ctx.tenant, ctx.route.tier
        rule = tenant.shadow if tenant is not None else None
        complete = ctx.result.status == 200 and ctx.result.outcome == "ok" and ctx.upstream.upstream_started and ctx.result.error is None
        if rule is None or tier is None or tier.name != rule.from_tier or not complete or ctx.upstream.response_text is None:
            self.sender.outcome("not_submitted", ctx.tenant_name, rule.from_tier if rule else "none",
                                rule.to_tier if rule else "none")
            return
        arm = ctx.assignment
        job = ShadowJob(ctx.request_id, ctx.tenant_name, rule, ctx.body, ctx.upstream.response_text, tier.name,
                        arm.experiment if arm else None, arm.arm if arm else None, ts=ctx.ts)
        # once every finisher has run: the request's own admission slot is free when pressure is checked
        asyncio.get_running_loop().call_soon(self.sender.submit, job)


def admission_pressure(admission: AdmissionStage) -> Callable[[], bool]:
    """True while any tier's admission gate has a queue or every slot taken: shadow traffic then stops."""

    def pressure() -> bool:
        return any(len(gate.queue) or gate.in_flight >= gate.slots for gate in admission.gates.values())

    return pressure


class GatewaySend:
    """`send(tier, body)` of the ShadowSender: one non-streamed request to `tier` through the proxy stage, at
    batch priority, never waiting for a slot, outside any tenant's limits, priced at the tier's prices."""

    def __init__(self, config: Callable[[], GatewayConfig], pool: ReplicaPool, admission: AdmissionStage,
                 proxy: ProxyStage, count_tokens: Callable[[RequestContext], None]) -> None:
        self._config = config  # the serving config version, read per call (hot reload)
        self._pool = pool
        self._admission = admission
        self._proxy = proxy
        self._count_tokens = count_tokens

    async def __call__(self, tier_name: str, body: dict[str, Any]) -> ShadowReply:
        config = self._config()
        tier = config.tiers.get(tier_name)
        if tier is None or tier.endpoint != "chat":
            return ShadowReply("", 404)
        ctx = RequestContext(f"shadow-{next(_SHADOW_IDS)}", "chat" if "messages" in body else "completions", config,
                             b"", None, time.perf_counter(), time.time())
        ctx.body, ctx.model_requested = body, tier_name
        ctx.reading = read(ctx.endpoint, body)
        max_tokens = body.get("max_tokens")
        ctx.max_tokens = max_tokens if isinstance(max_tokens, int) else None
        ctx.prompt_tokens_est = ctx.input_tokens_est()
        ctx.route.pinned(tier, self._pool.rank(tier, ctx.prompt_tokens_est, config.routes.balancing))
        gate = self._admission.gate(ctx, tier) if config.routes.admission.enabled and ctx.route.candidates else None
        if gate is not None and not gate.has_room():
            return ShadowReply("", SKIPPED_BUSY)  # never queue behind (or ahead of) a client
        permit = await gate.acquire("shadow", "batch", 0.0) if gate is not None else None
        if permit is not None:
            ctx.first_byte_hooks.append(permit.sample)
        try:
            await self._proxy(ctx)
            status = 200
        except GatewayError as err:
            status = err.status
        finally:
            if permit is not None:
                permit.release()
        finished = time.perf_counter()
        if not ctx.upstream.upstream_started:
            return ShadowReply("", status)
        self._count_tokens(ctx)
        prompt, completion = ctx.upstream.prompt_tokens or 0, ctx.upstream.completion_tokens or 0
        cost = tier.price_at(utc_day(ctx.ts)).cost_usd(prompt, completion, ctx.upstream.cached_tokens)
        ttft = (ctx.upstream.first_token_at - ctx.started) * 1000 if ctx.upstream.first_token_at is not None else None
        return ShadowReply(ctx.upstream.response_text or "", status, cost, None if ttft is None else round(ttft, 3),
                           round((finished - ctx.started) * 1000, 3), prompt, completion)


class BackgroundEncoder:
    """The shadow agreement's sentence encoder (an Embedder): its own MiniLM session, opened on first use, in
    its own thread at the lowest CPU priority (nice 19), so scoring a pair never takes a core from the event
    loop; not the request path's encoder (semantic cache, embedding tiers), whose thread keeps its priority."""

    def __init__(self, open_session: Callable[[], EncoderSession] | None = None) -> None:
        self._open = open_session or _sentence_session
        self._session: EncoderSession | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shadow-encoder", initializer=_lowest_priority)

    @property
    def opened(self) -> bool:
        return self._session is not None

    async def embed_many(self, texts: Sequence[str], *, scope: str) -> tuple[list[Embedding], int]:
        """`scope` is the tenant's: this encoder caches nothing, so no tenant's texts meet another's."""
        vectors = await asyncio.get_running_loop().run_in_executor(self._pool, self._embed, list(texts))
        return list(vectors), len(texts)

    def _embed(self, texts: list[str]) -> Embedding:
        if self._session is None:
            self._session = self._open()
        return self._session.embed(texts)

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lowest_priority() -> None:
    """The calling thread's nice value to 19 (Linux: per thread), where the platform allows."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
    except (AttributeError, OSError):  # no setpriority, or not permitted: the default priority
        pass


def _sentence_session() -> EncoderSession:
    from gateway.classifier.encoder import CPU_VARIANT, SENTENCE, EncoderSession, default_model_path

    return EncoderSession(default_model_path(CPU_VARIANT, SENTENCE), providers=["CPUExecutionProvider"], threads=1)
