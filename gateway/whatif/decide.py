"""One logged request decided again under a config: the policy, the route and the cache, then priced.

The steps are the request path's, in its order, each from the server's own functions (`steps`):

    tenant     by name (a tenant the candidate drops: 401); its experiment arm from the logged assignment keys
    limits     max_tokens (the tenant's default, cap and output cap: 400 when it rejects), prompt caps (413)
    route      model 'auto': quality floor, bands, default tier; the tier map and the allowed check (404, 403);
               a session holds its tier, moving only up (keyed by the conversation as the server keys it: the
               log's `turn_keys`; lines without them hold none); a tier down when logged (`rerouted_from`): the
               detour; spill under the candidate's rule, each tier's predicted TTFT the one the log last recorded
               for it (`Forecasts`: the load the logged policy put on the fleet, not the candidate's)
    admission  rate limits and the daily budget at the logged arrival time (429; `limits`)
    cache      the logged outcome where the decision keeps it (same tier, the rule still caching the request);
               an exact hit where the candidate caches what the log shows was answered before on that tier;
               none where the log shows no cache at all ("off": the gateway ran without Redis)
    price      the logged tokens at the candidate tier's prices of the day; the output cut to a smaller
               max_tokens; prefix-cached tokens only on the tier that cached them

What the log cannot decide is said: the tokens of a request the log refused (prompt from the reading's estimate,
output the tenant's mean so far), a recorded 5xx or 499 (kept as it happened), and shed requests (admission
control is timed by the fleet simulation, `fleet`).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from typing import Any

from gateway.config import GatewayConfig, TenantPolicy, Tier
from gateway.config.tenants import ANONYMOUS
from gateway.errors import GatewayError
from gateway.routing.sessions import LocalSessions
from gateway.types import AUTO_MODEL
from gateway.whatif.limits import ReplayLimits
from gateway.whatif.records import SHED, Logged
from gateway.whatif.steps import Asked, candidate_tier, detour_tier, hold_session, spill

KEPT_ERRORS_BELOW = 500  # recorded client errors other than the policy's own are kept as they were
POLICY_ERRORS = frozenset({"max_tokens_exceeded", "prompt_too_large", "tier_not_allowed", "model_not_found",
                           "rate_limit_requests", "rate_limit_tokens", "budget_exhausted", "invalid_api_key"})
HITS = ("hit", "semantic_hit")
NO_BODY: dict[str, Any] = {}  # the log has no body: an embedding request's dimensions are not checked
STORED_MAX = 200_000  # exact-cache keys the replay remembers
STALE_S = 5.0  # a tier's logged forecast older than this: the tier is taken as idle (predicted 0)


class Forecasts:
    """Each tier's predicted TTFT as the log last recorded it, on the log's clock: a served line's
    `predicted_ttft_ms` (the replica's at admission), both tiers' forecasts of a line that spilled. None recorded
    for STALE_S: the tier is taken as idle (0 s: within any SLO)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}

    def see(self, rec: Logged) -> None:
        if rec.predicted_ttft_ms is not None and rec.tier is not None:
            self._last[rec.tier] = (rec.arrival, rec.predicted_ttft_ms / 1000)
        for tier, ttft_ms in rec.spill_forecasts:
            self._last[tier] = (rec.arrival, ttft_ms / 1000)

    def ttft_s(self, tier: str, now: float) -> float:
        seen = self._last.get(tier)
        return 0.0 if seen is None or now - seen[0] > STALE_S else seen[1]


@dataclass(slots=True)
class Decision:
    """What the replay decided for one request under one config."""

    tier: str | None
    refused: str | None  # the error code the client would get, None when answered
    cache: str
    prompt: int
    completion: int
    cost: float
    arm: str | None = None
    session_route: str | None = None
    spilled_from: str | None = None


class Decider:
    """Decisions for one scenario, in arrival order (sessions, limits and the cache keep state)."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.tenants: dict[str, TenantPolicy] = {t.name: t for t in config.tenants_by_key_hash.values()}
        if config.anonymous is not None:
            self.tenants.setdefault(ANONYMOUS, config.anonymous)
        self._ranks = {t.name: i for i, t in enumerate(config.routes.tiers)}
        self._sessions = LocalSessions()  # as many as a gateway keeps in process
        self.limits = ReplayLimits()
        self._stored: dict[tuple[str, str, str], float] = {}  # (scope, tier, digest) -> expires
        self._mean_out: dict[str, tuple[int, int]] = {}  # tenant -> (served requests, completion tokens)
        self.forecasts = Forecasts()
        policies = [*self.tenants.values()]
        policies += [arm.policy for t in self.tenants.values() if t.plan for e in t.plan.experiments for arm in e.arms]
        self._spills = any(t.spill is not None for t in policies)  # else no forecast is ever read

    def decide(self, rec: Logged) -> Decision:
        if self._spills:
            self.forecasts.see(rec)
        if rec.served and rec.completion:
            n, total = self._mean_out.get(rec.tenant, (0, 0))
            self._mean_out[rec.tenant] = (n + 1, total + rec.completion)
        if not rec.replayable:
            return self._price_only(rec)
        if rec.refused is not None and rec.refused not in POLICY_ERRORS and rec.refused not in SHED \
                and rec.status < KEPT_ERRORS_BELOW:
            return Decision(rec.tier, rec.refused, rec.cache, 0, 0, 0.0)  # a bad request stays bad
        tenant = self.tenants.get(rec.tenant)
        if tenant is None:
            return Decision(None, "invalid_api_key", "off", 0, 0, 0.0)
        arm = None
        if tenant.plan is not None and (assignment := self._assign(tenant, rec)) is not None:
            tenant, arm = assignment.policy, assignment.arm
        try:
            max_tokens = self._max_tokens(rec, tenant)
            tier, session_route, spilled_from = self._route(rec, tenant, max_tokens)
        except GatewayError as err:
            return Decision(None, err.code or f"status_{err.status}", "off", 0, 0, 0.0, arm)
        prompt, completion = self._tokens(rec, tenant, tier, max_tokens)
        refused = self.limits.admit(tenant, rec.input_tokens + rec.generated * max_tokens, rec.arrival)
        if refused is not None:
            return Decision(tier.name, refused, "off", 0, 0, 0.0, arm, session_route, spilled_from)
        if rec.refused is not None and rec.tier == tier.name:  # shed, or failed upstream, on the same tier: kept
            return Decision(tier.name, rec.refused, rec.cache, prompt, completion, 0.0, arm, session_route,
                            spilled_from)
        cache = self._cache(rec, tenant, tier)
        cached = rec.cached if tier.name == rec.tier else 0
        priced = tier.price_at(rec.day).cost_usd(prompt, completion, cached)
        cost = 0.0 if cache in HITS else priced
        used = prompt + completion if cache not in HITS else 0
        self.limits.book(tenant, used - (rec.input_tokens + rec.generated * max_tokens), cost,
                         rec.arrival + rec.e2e_ms / 1000)
        return Decision(tier.name, None, cache, prompt, completion, cost, arm, session_route, spilled_from)

    def _price_only(self, rec: Logged) -> Decision:
        """A line from before the replay fields: its recorded tier, outcome and tokens, at the config's prices."""
        tier = self.config.tiers.get(rec.tier) if rec.tier is not None else None
        if tier is None or not rec.worked or rec.cache in HITS:
            return Decision(rec.tier, rec.refused, rec.cache, rec.prompt, rec.completion, 0.0)
        return Decision(tier.name, rec.refused, rec.cache, rec.prompt, rec.completion,
                        tier.price_at(rec.day).cost_usd(rec.prompt, rec.completion, rec.cached))

    def _assign(self, tenant: TenantPolicy, rec: Logged) -> Any:
        """The experiment arm, as `gateway.experiments.assign.assign` places the logged keys."""
        from gateway.experiments.assign import position

        assert tenant.plan is not None
        for experiment in tenant.plan.experiments:
            key = rec.sticky_user if experiment.sticky_by == "user" and rec.sticky_user is not None \
                else rec.sticky_conversation
            if key is None:
                continue
            index = bisect.bisect_right(experiment.cuts, position(experiment.salt, key))
            if index < len(experiment.arms):
                return experiment.arms[index]
        return None

    def _max_tokens(self, rec: Logged, tenant: TenantPolicy) -> int:
        """The policy stage's max_tokens and prompt caps (`gateway.stages.policy`) on the logged numbers."""
        from gateway.errors import BodyTooLarge, InvalidRequest

        rule, asked = tenant.max_tokens, rec.asked
        if asked is not None and asked > rule.maximum and rule.on_exceed == "reject":
            raise InvalidRequest("max_tokens over the tenant's maximum", code="max_tokens_exceeded")
        limit = rule.default if asked is None else min(asked, rule.maximum)
        cap = tenant.output_cap.tokens if tenant.output_cap else None
        for size, most in ((rec.input_chars, tenant.max_prompt_chars), (rec.input_tokens, tenant.max_prompt_tokens)):
            if most is not None and size > most:
                raise BodyTooLarge("input over the tenant's prompt cap", code="prompt_too_large")
        return limit if cap is None else min(limit, cap)

    def _route(self, rec: Logged, tenant: TenantPolicy, max_tokens: int) -> tuple[Tier, str | None, str | None]:
        """The tier serving the request (route, session, detour, spill: the server's order), the session's effect
        and the tier spill moved it from."""
        config, model = self.config, rec.model
        asked = Asked(rec.endpoint, model, max_tokens, rec.input_tokens, NO_BODY, rec.difficulty, rec.quality, rec.day)
        decided = candidate_tier(config, tenant, asked)
        tier = decided.tier
        session_route = spilled_from = None
        rule = tenant.sessions
        if rule is not None and model == AUTO_MODEL and tier.endpoint == "chat" and rec.turn_current is not None:
            held = hold_session(self._sessions, rec.turn_parent, rec.turn_current, tier, self._ranks, rule.ttl_s,
                                rec.arrival, config, tenant, max_tokens, record=rec.served)
            tier, session_route = held.tier, held.route
        if model == AUTO_MODEL and rec.rerouted_from is not None:
            tier = detour_tier(config, tier, tenant, max_tokens, rec.rerouted_from) or tier
        if tenant.spill is not None and model == AUTO_MODEL and tier.endpoint == "chat" and tier.replicas:
            now, forecasts = rec.arrival, self.forecasts
            choice = spill(tenant.spill, config, tenant, decided, tier, max_tokens,
                           lambda t: forecasts.ttft_s(t.name, now))
            spilled_from, tier = choice.spilled_from, choice.tier
        return tier, session_route, spilled_from

    def _tokens(self, rec: Logged, tenant: TenantPolicy, tier: Tier, max_tokens: int) -> tuple[int, int]:
        """(prompt, completion) tokens the candidate's answer would cost: the logged ones, the output cut to
        max_tokens per output; for a request the log refused, the reading's estimate and the tenant's mean."""
        if rec.refused is not None and rec.completion == 0:
            n, total = self._mean_out.get(rec.tenant, (0, 0))
            completion = round(total / n) if n else max_tokens // 2
            return max(rec.prompt, rec.input_tokens), min(completion, max_tokens * rec.outputs)
        return rec.prompt, min(rec.completion, max_tokens * rec.generated)

    def _cache(self, rec: Logged, tenant: TenantPolicy, tier: Tier) -> str:
        if rec.cache == "off":
            return "off"  # the gateway that served it had no response cache (no Redis): a policy adds none
        rule = tenant.cache
        caches = rule.enabled and (rec.cacheable == "deterministic" or
                                   (rec.cacheable == "always" and rule.mode == "always"))
        if not caches or rec.digest is None:
            return "bypass" if rec.cache != "off" or rule.enabled else "off"
        if rec.tier == tier.name and rec.cache in ("miss", *HITS):
            outcome = rec.cache  # looked up on this tier then too: what the cache answered then
        else:
            expires = self._stored.get(("*shared*" if rule.shared else tenant.name, tier.name, rec.digest))
            outcome = "hit" if expires is not None and expires > rec.arrival else "miss"
        if outcome == "miss" and rec.served:
            self._store(("*shared*" if rule.shared else tenant.name, tier.name, rec.digest),
                        rec.arrival + rec.e2e_ms / 1000 + rule.ttl_s, rec.arrival)
        return outcome

    def _store(self, key: tuple[str, str, str], expires: float, now: float) -> None:
        """Remember a stored answer until it expires; bounded, as Redis' memory is (the oldest go first)."""
        stored = self._stored
        stored[key] = expires
        if len(stored) > STORED_MAX:
            for old in [k for k, until in stored.items() if until <= now][:STORED_MAX // 2] or \
                    list(itertools.islice(stored, STORED_MAX // 4)):
                del stored[old]
